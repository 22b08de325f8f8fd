/* The seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), made
 * with the project's own code so that they are real inputs and can be made
 * again: `./pe fuzz seeds` runs
 *
 *     fuzz_seeds SOURCE_DIR OUT_DIR
 *
 * and writes OUT_DIR/<target>/<name> for each seed: requests of every body
 * kind packed by protobuf-c, RegisterRequests of the models of
 * conf/models/ and of small model texts (parsed by libpeclient's model file
 * parser and builder) with several option sets, checkpoints written by the
 * daemon's writer in each format version, the model files and the config
 * file. Files of the same name are replaced; others (the regress_* inputs
 * of fixed bugs) are left as they are. Deterministic: the same sources
 * give the same bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pe_model_file.h"
#include "server/checkpoint/file.h"
#include "service.pb-c.h"

static const char *out_dir;

static void die(const char *what, const char *why) {
  fprintf(stderr, "fuzz_seeds: %s: %s\n", what, why);
  exit(1);
}

static void put_file(const char *target, const char *name, const void *buf, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", out_dir, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) die(path, strerror(errno));
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) die(path, strerror(errno));
}

static char *read_text(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) die(path, strerror(errno));
  char *buf = NULL;
  size_t cap = 0;
  *len = 0;
  for (;;) {
    if (*len + 4096 > cap && !(buf = realloc(buf, cap = cap * 2 + 4096)))
      die(path, "out of memory");
    size_t k = fread(buf + *len, 1, cap - *len, f);
    *len += k;
    if (k == 0) break;
  }
  fclose(f);
  return buf;
}

/* --- model files --------------------------------------------------------- */
/* Small models in the model-file format, one per layer kind and optimizer,
 * so that the program seeds cover the ops the builder emits. */
static const struct {
  const char *name, *text;
} small_models[] = {
    {"tiny_mlp",
     "name tiny_mlp\nbatch 4\ninput x 4\nlabel y\nfc 8 act=relu\nfc 3\n"
     "loss softmax_with_cross_entropy\naccuracy\noptimizer sgd lr=0.1\n"},
    {"tiny_cnn",
     "name tiny_cnn\ninput img 1 8 8\nlabel y\nconv2d 4 3 pad=1 act=relu\nbatch_norm\n"
     "pool2d max 2\ndropout 0.5 seed=7\nflatten\nfc 3\nloss softmax_with_cross_entropy\n"
     "accuracy top=2\noptimizer adam lr=0.001 beta1=0.9 beta2=0.999 epsilon=1e-8\n"
     "schedule cosine warmup=2 decay_steps=10 min_lr=0.0001\n"},
    {"tiny_residual",
     "# a residual block with a projection shortcut\nname tiny_residual\ninput x 2 6 6\n"
     "label y\nconv2d 2 3 pad=1\nsave in\nconv2d 4 3 stride=2 pad=1 no_bias\n"
     "batch_norm act=relu momentum=0.8 epsilon=0.001\nsave main\nfrom in\n"
     "conv2d 4 1 stride=2 no_bias\nadd main act=relu\npool2d avg 3 global\nfc 2 act=tanh\n"
     "softmax\nloss cross_entropy\naccuracy\n"
     "optimizer adamw lr=0.01 weight_decay=0.1 no_decay_1d clip_norm=1\n"
     "schedule multistep milestones=2,4 gamma=0.5 warmup=1\n"},
    {"tiny_momentum",
     "name tiny_momentum\r\ninput x 3 2\r\nlabel y\r\nfc 5 act=sigmoid num_col_dims=1 name=h\r\n"
     "fc 4 no_bias\r\ntanh\r\nrelu\r\nfc 2\r\nloss softmax_with_cross_entropy\r\naccuracy\r\n"
     "optimizer momentum lr=0.1 mu=0.9 nesterov weight_decay=0.0001\r\n"
     "schedule step decay_steps=5 gamma=0.9\r\n"},
    {"tiny_eval",
     "name tiny_eval\ninput x 6\nlabel y\nfc 4 act=softmax\nfc 2\n"
     "loss softmax_with_cross_entropy\naccuracy\n"},
};
#define N_SMALL (sizeof small_models / sizeof small_models[0])

static void parse_model(const char *text, size_t len, const char *source, pe_model_spec *out) {
  char err[512];
  if (pe_model_file_parse(text, len, source, out, err, sizeof err) != 0) die(source, err);
}

/* --- requests ------------------------------------------------------------ */
static void put_request(const char *name, const Pe__Request *rq) {
  size_t len = pe__request__get_packed_size(rq);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) die(name, "out of memory");
  pe__request__pack(rq, buf);
  put_file("request", name, buf, len);
  free(buf);
}

static Pe__Request request(Pe__Request__BodyCase kind, uint64_t id) {
  Pe__Request rq = PE__REQUEST__INIT;
  rq.client_id = 0x5eed0000cafeull;
  rq.request_id = id;
  rq.client_pid = 4242;
  rq.client_start = 123456789;
  rq.body_case = kind;
  return rq;
}

/* A tensor of two dimensions by value. */
static Pe__Tensor tensor(const char *name, Pe__DataType dt, int64_t shape[2], void *data,
                         size_t len) {
  Pe__Tensor t = PE__TENSOR__INIT;
  t.name = (char *)name;
  t.dtype = dt;
  t.n_shape = 2;
  t.shape = shape;
  t.data.data = data;
  t.data.len = len;
  return t;
}

static void request_seeds(const pe_model_spec *mlp) {
  Pe__Request rq = request(PE__REQUEST__BODY_PING, 1);
  rq.ping = true;
  put_request("ping", &rq);
  rq = request(PE__REQUEST__BODY_STATUS, 2);
  rq.status = true;
  put_request("status", &rq);
  rq = request(PE__REQUEST__BODY_CLOSE, 3);
  rq.close = true;
  put_request("close", &rq);

  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  Pe__RegisterOptions ro = PE__REGISTER_OPTIONS__INIT;
  reg.program.data = mlp->bytes;
  reg.program.len = mlp->len;
  reg.model = (char *)"mlp";
  ro.places = (char *)"cpu:2";
  ro.strategy = PE__STRATEGY__AUTO;
  ro.seed = 9;
  ro.persistent = true;
  reg.options = &ro;
  rq = request(PE__REQUEST__BODY_REGISTER, 4);
  rq.register_ = &reg;
  put_request("register", &rq);

  Pe__InitRequest in = PE__INIT_REQUEST__INIT;
  in.handle = 0x1234abcd5678ull;
  in.force = true;
  rq = request(PE__REQUEST__BODY_INIT, 5);
  rq.init = &in;
  put_request("init", &rq);

  /* A run of one example (image f32 [1,4], label i64 [1,1]). */
  float image[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  int64_t label[1] = {2}, image_shape[2] = {1, 4}, label_shape[2] = {1, 1};
  Pe__Tensor ti = tensor("x", PE__DATA_TYPE__F32, image_shape, image, sizeof image);
  Pe__Tensor tl = tensor("y", PE__DATA_TYPE__I64, label_shape, label, sizeof label);
  Pe__Tensor *feeds[] = {&ti, &tl};
  char *fetch[] = {(char *)"loss", (char *)"accuracy"};
  Pe__RunRequest run = PE__RUN_REQUEST__INIT;
  Pe__RunOptions opts = PE__RUN_OPTIONS__INIT;
  run.handle = 0x1234abcd5678ull;
  run.n_feeds = 2;
  run.feeds = feeds;
  run.n_fetch = 2;
  run.fetch = fetch;
  run.steps = 2;
  opts.timeout_ms = 1000;
  opts.check_nan_inf = true;
  run.options = &opts;
  rq = request(PE__REQUEST__BODY_RUN, 6);
  rq.run = &run;
  put_request("run", &rq);

  /* The image in a shared-memory region, one batch. */
  Pe__ShmRef ref = PE__SHM_REF__INIT;
  ref.region = 3;
  ref.offset = 64;
  ref.length = sizeof image;
  ti.data.len = 0;
  ti.shm = &ref;
  run.batches = 1;
  run.steps = 0;
  run.options = NULL;
  rq = request(PE__REQUEST__BODY_RUN, 7);
  rq.run = &run;
  put_request("run_shm", &rq);
  /* The same image as row 1 of a two-row array in the region (ShmRef.rows). */
  int64_t rows[1] = {1};
  ref.length = 2 * sizeof image;
  ref.n_rows = 1;
  ref.rows = rows;
  rq = request(PE__REQUEST__BODY_RUN, 18);
  rq.run = &run;
  put_request("run_shm_rows", &rq);
  ti.shm = NULL;
  ti.data.len = sizeof image;

  char *names[] = {(char *)"fc_0.w", (char *)"fc_0.b"};
  Pe__ParamsRequest pr = PE__PARAMS_REQUEST__INIT;
  pr.model = (char *)"mlp";
  pr.n_names = 2;
  pr.names = names;
  rq = request(PE__REQUEST__BODY_GET_PARAMS, 8);
  rq.get_params = &pr;
  put_request("get_params", &rq);
  Pe__Tensor *values[] = {&ti};
  pr.n_names = 0;
  pr.names = NULL;
  pr.n_values = 1;
  pr.values = values;
  rq = request(PE__REQUEST__BODY_SET_PARAMS, 9);
  rq.set_params = &pr;
  put_request("set_params", &rq);

  Pe__CheckpointRequest cr = PE__CHECKPOINT_REQUEST__INIT;
  cr.model = (char *)"mlp";
  cr.name = (char *)"epoch-3";
  rq = request(PE__REQUEST__BODY_SAVE, 10);
  rq.save = &cr;
  put_request("save", &rq);
  rq = request(PE__REQUEST__BODY_LOAD, 11);
  rq.load = &cr;
  put_request("load", &rq);

  Pe__DeregisterRequest dr = PE__DEREGISTER_REQUEST__INIT;
  dr.handle = 0x1234abcd5678ull;
  rq = request(PE__REQUEST__BODY_DEREGISTER, 12);
  rq.deregister = &dr;
  put_request("deregister", &rq);
  Pe__DropModelRequest dm = PE__DROP_MODEL_REQUEST__INIT;
  dm.model = (char *)"mlp";
  rq = request(PE__REQUEST__BODY_DROP_MODEL, 13);
  rq.drop_model = &dm;
  put_request("drop_model", &rq);

  uint8_t token[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  Pe__ShmRequest sr = PE__SHM_REQUEST__INIT;
  sr.name = (char *)"/pe-4242-1";
  sr.size = 1 << 20;
  sr.token.data = token;
  sr.token.len = sizeof token;
  rq = request(PE__REQUEST__BODY_REGISTER_SHM, 14);
  rq.register_shm = &sr;
  put_request("register_shm", &rq);
  sr = (Pe__ShmRequest)PE__SHM_REQUEST__INIT;
  sr.region = 3;
  rq = request(PE__REQUEST__BODY_UNREGISTER_SHM, 15);
  rq.unregister_shm = &sr;
  put_request("unregister_shm", &rq);
}

/* --- programs (RegisterRequests) ----------------------------------------- */
static void put_register(const char *name, const pe_model_spec *m, const Pe__RegisterOptions *o) {
  Pe__RegisterRequest reg = PE__REGISTER_REQUEST__INIT;
  reg.program.data = m->bytes;
  reg.program.len = m->len;
  reg.model = (char *)m->name;
  reg.options = (Pe__RegisterOptions *)o;
  size_t len = pe__register_request__get_packed_size(&reg);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) die(name, "out of memory");
  pe__register_request__pack(&reg, buf);
  put_file("program", name, buf, len);
  free(buf);
}

static void program_seeds(const pe_model_spec *mlp, const pe_model_spec *cnn,
                          const pe_model_spec *resnet, const pe_model_spec *small) {
  put_register("mlp", mlp, NULL);
  put_register("cnn", cnn, NULL);
  put_register("resnet", resnet, NULL);
  Pe__RegisterOptions o = PE__REGISTER_OPTIONS__INIT;
  o.for_test = true;
  put_register("resnet_for_test", resnet, &o);
  o = (Pe__RegisterOptions)PE__REGISTER_OPTIONS__INIT;
  o.places = (char *)"cpu:2";
  o.strategy = PE__STRATEGY__REDUCE;
  o.fuse_allreduce = true;
  o.fuse_bucket_bytes = 4096;
  put_register("cnn_cpu2_reduce_fused", cnn, &o);
  o.places = (char *)"sim:3";
  o.strategy = PE__STRATEGY__SHARDED;
  o.fuse_allreduce = false;
  o.fuse_bucket_bytes = 0;
  put_register("mlp_sim3_sharded", mlp, &o);
  o = (Pe__RegisterOptions)PE__REGISTER_OPTIONS__INIT;
  char *keep[] = {(char *)"fc_0.tmp_0", (char *)"fc_0.out"};
  o.n_keep = 2;
  o.keep = keep;
  o.no_op_fusion = true;
  o.loss = (char *)"mean_0.out";
  put_register("mlp_keep_no_fusion", mlp, &o);
  o = (Pe__RegisterOptions)PE__REGISTER_OPTIONS__INIT;
  Pe__OptimizerDesc od = PE__OPTIMIZER_DESC__INIT;
  Pe__LrSchedule ls = PE__LR_SCHEDULE__INIT;
  int64_t milestones[] = {3, 7};
  od.type = (char *)"adam";
  od.learning_rate = 0.001f;
  od.beta1 = 0.9f;
  od.beta2 = 0.999f;
  od.epsilon = 1e-8f;
  od.grad_clip_norm = 5;
  ls.type = (char *)"multistep";
  ls.n_milestones = 2;
  ls.milestones = milestones;
  ls.gamma = 0.5f;
  od.lr_schedule = &ls;
  o.optimizer = &od;
  o.places = (char *)"cpu:2";
  put_register("mlp_adam_override", mlp, &o);
  for (size_t i = 0; i < N_SMALL; i++) put_register(small[i].name, &small[i], NULL);
  o = (Pe__RegisterOptions)PE__REGISTER_OPTIONS__INIT;
  o.places = (char *)"cpu:2";
  o.strategy = PE__STRATEGY__ALLREDUCE;
  put_register("tiny_residual_cpu2", &small[2], &o);
}

/* --- checkpoints --------------------------------------------------------- */
/* The file of version v ('1', '2', '3') from a version 03 file: 02 has no
 * generator record (12 bytes before the CRC), 01 no run origins either. */
static void put_checkpoint(const char *name, const uint8_t *v3, size_t len, size_t n_origin_bytes,
                           char v) {
  uint8_t *buf = malloc(len);
  if (!buf) die(name, "out of memory");
  size_t body = len - 4; /* without the CRC */
  memcpy(buf, v3, body);
  if (v <= '2') body -= 12;
  if (v == '1') body -= 4 + n_origin_bytes;
  buf[7] = (uint8_t)v;
  uint32_t crc = pe_crc32(buf, body);
  for (int i = 0; i < 4; i++) buf[body + (size_t)i] = (uint8_t)(crc >> (8 * i));
  put_file("checkpoint", name, buf, body + 4);
  free(buf);
}

static void checkpoint_seeds(void) {
  float w[6] = {0.25f, -1.5f, 3.0f, 0.0f, 1e-3f, -2.0f};
  int64_t steps[1] = {42};
  uint8_t mask[3] = {1, 0, 1};
  pe_ckpt_entry e[3] = {0};
  e[0].name = (char *)"fc_0.w";
  e[0].t.dtype = PE_F32;
  e[0].t.shape = PE_SHAPE(2, 3);
  e[0].t.data = w;
  e[0].t.cap = sizeof w;
  e[1].name = (char *)"@LR_STEP@";
  e[1].t.dtype = PE_I64;
  e[1].t.shape = PE_SHAPE(1);
  e[1].t.data = steps;
  e[1].t.cap = sizeof steps;
  e[2].name = (char *)"mask";
  e[2].t.dtype = PE_U8;
  e[2].t.shape = PE_SHAPE(3);
  e[2].t.data = mask;
  e[2].t.cap = sizeof mask;
  pe_run_origin origins[2] = {{0x5eed, 17, 3}, {0x5eee, 4, 1}};
  pe_model_mark mark = {.origins = origins, .n_origins = 2, .has_rng = true, .rng_offset = 977};
  uint8_t *buf;
  size_t len;
  pe_status *st = pe_ckpt_encode(e, 3, &mark, &buf, &len);
  if (st) die("checkpoint", pe_status_msg(st));
  put_file("checkpoint", "v3_three_tensors", buf, len);
  put_checkpoint("v2_three_tensors", buf, len, sizeof origins / sizeof origins[0] * 20, '2');
  put_checkpoint("v1_three_tensors", buf, len, sizeof origins / sizeof origins[0] * 20, '1');
  free(buf);
  /* A scalar (rank 0) and an empty tensor, no origins, no generator. */
  e[0].t.shape = (pe_shape){0};
  e[0].t.cap = sizeof(float);
  e[1].name = (char *)"empty";
  e[1].t.dtype = PE_F64;
  e[1].t.shape = PE_SHAPE(0, 5);
  e[1].t.cap = 0;
  if ((st = pe_ckpt_encode(e, 2, NULL, &buf, &len))) die("checkpoint", pe_status_msg(st));
  put_file("checkpoint", "v3_scalar_and_empty", buf, len);
  free(buf);
  if ((st = pe_ckpt_encode(NULL, 0, NULL, &buf, &len))) die("checkpoint", pe_status_msg(st));
  put_file("checkpoint", "v3_no_tensors", buf, len);
  free(buf);
}

/* --- config -------------------------------------------------------------- */
static const char small_config[] =
    "; a daemon for one user\n"
    "[server]\nsocket = ipc:///tmp/pe-fuzz.sock\nsocket_mode = 0600\nrequest_threads = 2\n"
    "log_level = debug\n"
    "[runtime]\nplaces = sim:2\nworker_threads = 2\nsync = producer\nflush_denormals = false\n"
    "[state]\nstate_dir = /tmp/pe-fuzz-state\ncheckpoint_interval = 0\n"
    "[sessions]\nttl = 1.5\n"
    "[limits]\nmax_message = 1G\nmemory_per_client = 512M\nmemory_per_run = 25%\n"
    "max_program_ops = 1000\ndedup_bytes = 0\n";

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fuzz_seeds SOURCE_DIR OUT_DIR\n");
    return 2;
  }
  const char *src = argv[1];
  out_dir = argv[2];
  char path[4096];
  pe_model_spec file[3];
  const char *files[3] = {"mlp", "cnn", "resnet"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/conf/models/%s", src, files[i]);
    size_t len;
    char *text = read_text(path, &len);
    parse_model(text, len, files[i], &file[i]);
    put_file("model", files[i], text, len);
    free(text);
  }
  pe_model_spec small[N_SMALL];
  for (size_t i = 0; i < N_SMALL; i++) {
    parse_model(small_models[i].text, strlen(small_models[i].text), small_models[i].name,
                &small[i]);
    put_file("model", small_models[i].name, small_models[i].text, strlen(small_models[i].text));
  }
  request_seeds(&small[0]);
  program_seeds(&file[0], &file[1], &file[2], small);
  checkpoint_seeds();
  snprintf(path, sizeof path, "%s/conf/pe-executord.conf", src);
  size_t len;
  char *text = read_text(path, &len);
  put_file("config", "pe-executord.conf", text, len);
  free(text);
  put_file("config", "small.conf", small_config, strlen(small_config));
  for (int i = 0; i < 3; i++) pe_model_spec_release(&file[i]);
  for (size_t i = 0; i < N_SMALL; i++) pe_model_spec_release(&small[i]);
  return 0;
}
