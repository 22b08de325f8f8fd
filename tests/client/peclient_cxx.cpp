// A C++ trainer against libpeclient.so: every public header compiles as C++
// (their extern "C" blocks give the functions C linkage, so the names link
// against the library's C symbols), and the library works from C++: a
// program built here is byte for byte the built-in model's, a connection to
// a missing daemon fails with its code and message, the prefetcher runs, a
// parameters file reads back what was written.
// Linked with libpeclient.so alone (tests/CMakeLists.txt): nothing of the
// static archive or of pe_proto.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pe_batch_prefetch.h"
#include "pe_builder.h"
#include "pe_client.h"
#include "pe_dataset.h"
#include "pe_model_file.h"
#include "pe_models.h"
#include "pe_params_file.h"
#include "pe_recipe.h"
#include "peclient_version.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string &what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    failures++;
  }
}

// The MLP of pe_models.h, written with the builder from C++.
std::vector<uint8_t> build_mlp() {
  pe_builder *b = pe_builder_new();
  const int64_t image_dims[] = {-1, 784}, label_dims[] = {-1, 1};
  const char *image = pe_builder_data(b, "image", PE_B_F32, 2, image_dims);
  const char *label = pe_builder_data(b, "label", PE_B_I64, 2, label_dims);
  pe_b_fc_opts hidden = {};
  hidden.act = PE_B_ACT_RELU;
  const char *x = pe_builder_fc(b, image, 256, &hidden);
  x = pe_builder_fc(b, x, 128, &hidden);
  const char *logits = pe_builder_fc(b, x, 10, nullptr);
  const char *loss =
      pe_builder_mean(b, pe_builder_softmax_with_cross_entropy(b, logits, label, nullptr));
  pe_builder_accuracy(b, logits, label, 1);
  pe_builder_append_backward(b, loss);
  pe_builder_momentum(b, 0.1f, 0.9f, false);
  uint8_t *bytes = nullptr;
  size_t len = 0;
  std::vector<uint8_t> out;
  if (pe_builder_finish(b, &bytes, &len) == 0) out.assign(bytes, bytes + len);
  expect(!out.empty(), std::string("builder: ") + (pe_builder_error(b) ? pe_builder_error(b) : ""));
  std::free(bytes);
  pe_builder_free(b);
  return out;
}

void builder_matches_builtin_model() {
  pe_model_spec m;
  char err[256] = "";
  expect(pe_model_spec_build("mlp", &m, err, sizeof err) == 0, err);
  std::vector<uint8_t> mine = build_mlp();
  expect(mine.size() == m.len && std::memcmp(mine.data(), m.bytes, m.len) == 0,
         "the C++-built MLP has the built-in mlp's bytes");
  expect(std::string(pe_program_optimizer(m.bytes, m.len)) == "momentum",
         "pe_program_optimizer reads momentum");
  pe_model_spec_release(&m);
}

void builder_error_is_reported() {
  pe_builder *b = pe_builder_new();
  expect(pe_builder_fc(b, "nothing", 10, nullptr) == nullptr, "fc on an undeclared input fails");
  const char *e = pe_builder_error(b);
  expect(e && std::strstr(e, "nothing"), "the builder's error names the input");
  pe_builder_free(b);
}

void connect_to_missing_daemon() {
  pe_client *c = pe_client_new();
  pe_client_opts o = {};
  o.address = "ipc:///nonexistent/pe-cxx.sock";
  int code = pe_client_connect(c, &o);
  expect(code == PE_C_ECONNECT, "connect to a missing socket: CONNECTION_ERROR");
  expect(std::strstr(pe_client_error(c), "/nonexistent/pe-cxx.sock") != nullptr,
         std::string("the error names the socket: ") + pe_client_error(c));
  expect(std::string(pe_client_code_name(PE_C_ESHAPE)) == "SHAPE_MISMATCH",
         "pe_client_code_name(PE_C_ESHAPE)");
  pe_client_free(c);
}

void prefetch_one_epoch() {
  std::vector<float> images(10 * 4);
  std::vector<int64_t> labels(10);
  for (int i = 0; i < 10; i++) {
    labels[i] = i;
    for (int j = 0; j < 4; j++) images[i * 4 + j] = static_cast<float>(i);
  }
  pe_dataset ds = {};
  ds.n = 10;
  ds.rows = 2;
  ds.cols = 2;
  ds.dim = 4;
  ds.images = images.data();
  ds.labels = labels.data();
  pe_batcher *bt = pe_batcher_new(&ds, 4, true, 7);
  std::vector<float> x0(16), x1(16);
  std::vector<int64_t> y0(4), y1(4);
  float *const x[2] = {x0.data(), x1.data()};
  int64_t *const y[2] = {y0.data(), y1.data()};
  pe_batch_prefetch *pf = nullptr;
  expect(pe_batch_prefetch_start(bt, x, y, 0, &pf) == 0, "prefetch starts");
  int n, k, seen = 0;
  int64_t sum = 0;
  while ((k = pe_batch_prefetch_next(pf, &n)) >= 0)
    for (int i = 0; i < n; i++, seen++) {
      sum += y[k][i];
      expect(x[k][i * 4] == static_cast<float>(y[k][i]), "an image travels with its label");
    }
  pe_batch_prefetch_stop(pf);
  pe_batcher_free(bt);
  expect(seen == 10 && sum == 45, "one epoch gives every example once");
}

void params_file_round_trip() {
  const float w[3] = {1.5f, -2.0f, 0.25f};
  const int64_t shape[1] = {3};
  pe_client_tensor t;
  pe_client_tensor_set(&t, "w", PE_B_F32, 1, shape, w);
  char path[] = "/tmp/pe-cxx-params.XXXXXX";
  int fd = mkstemp(path);
  expect(fd >= 0, "mkstemp");
  close(fd);
  char err[512] = "";
  uint64_t bytes = 0;
  expect(pe_params_file_write(&t, 1, path, &bytes, err, sizeof err) == 0 && bytes > 0, err);
  pe_params_file p = {};
  expect(pe_params_file_read(path, &p, err, sizeof err) == 0, err);
  expect(p.n == 1 && std::string(p.t[0].name) == "w" && p.t[0].nbytes == sizeof w &&
             std::memcmp(p.t[0].data, w, sizeof w) == 0,
         "the parameters file reads back what was written");
  pe_params_file_free(&p);
  unlink(path);
}

}  // namespace

int main() {
  expect(pe_client_version() && *pe_client_version(), "pe_client_version");
  builder_matches_builtin_model();
  builder_error_is_reported();
  connect_to_missing_daemon();
  prefetch_one_epoch();
  params_file_round_trip();
  if (failures) return 1;
  std::puts(
      "ok: a C++ trainer builds, connects, prefetches and writes parameters through "
      "libpeclient.so");
  return 0;
}
