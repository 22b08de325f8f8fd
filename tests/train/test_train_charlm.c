/* conf/models/charlm, the character-level transformer: the file parses,
 * its program validates and compiles in the daemon's IR (train pipeline:
 * backward, AdamW, the schedule) with the feeds `pe-client train --data`
 * fills (tokens and next, i64 [-1, 128]); and a smaller copy of the same
 * file (2 blocks, d=32, T=16, a 5-step warmup), trained in-process by the
 * sequential executor on windows of a fixed text, predicts the next byte:
 * the mean loss of the last 10 of 300 steps is below a third of the first
 * 10's (ln 256 = 5.5 nats at the start; measured: 5.25 -> 1.34). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "core/rng.h"
#include "engine/seq_executor.h"
#include "pe_model_file.h"
#include "test_assert.h"

enum { T = 16, BATCH = 16, STEPS = 300 };

static char *read_model(size_t *len) {
  const char *src = getenv("PE_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/conf/models/charlm", src && *src ? src : ".");
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  static char text[8192];
  *len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[*len] = 0;
  return text;
}

static pe_program *compile(const pe_model_spec *m) {
  pe_program *p;
  PE_CK_OK(pe_program_decode(m->bytes, m->len, &p));
  PE_CK_OK(pe_program_validate(p));
  PE_CK_OK(pe_program_compile(p, false));
  return p;
}

START_TEST(charlm_file_builds_and_validates) {
  size_t len;
  const char *text = read_model(&len);
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(text, len, "charlm", &m, err, sizeof err) == 0, "%s", err);
  ck_assert_str_eq(m.name, "charlm");
  ck_assert_str_eq(m.image, "tokens");
  ck_assert_str_eq(m.label, "next");
  ck_assert_int_eq(m.image_dtype, 3);
  ck_assert_int_eq(m.image_ndim, 2);
  ck_assert_int_eq(m.image_dims[0], -1);
  ck_assert_int_eq(m.image_dims[1], 128);
  ck_assert_int_eq(m.label_len, 128);
  ck_assert_int_eq(m.default_batch, 32);
  pe_program *p = compile(&m);
  /* the feeds as declared, the logits per position, one causal mask */
  const pe_block *main = p->blocks[p->main_block];
  const pe_var_desc *tok = pe_block_find_var_local(main, "tokens");
  const pe_var_desc *next = pe_block_find_var_local(main, "next");
  ck_assert_ptr_nonnull(tok);
  ck_assert_ptr_nonnull(next);
  ck_assert_int_eq(tok->dtype, PE_I64);
  ck_assert_int_eq(next->dtype, PE_I64);
  ck_assert_int_eq(tok->shape.ndim, 2);
  ck_assert_int_eq(next->shape.d[1], 128);
  int masks = 0, attentions = 0;
  for (int i = 0; i < main->n_ops; i++) {
    masks += !strcmp(main->ops[i]->type, "tril_triu");
    attentions += !strcmp(main->ops[i]->type, "scaled_dot_product_attention");
  }
  ck_assert_int_eq(masks, 1);
  ck_assert_int_eq(attentions, 4); /* one per block */
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

/* The file with T=16, d=32, FFN 64, 2 heads, its first two blocks and a
 * warmup of 5 steps: every other line as it is. */
static void small_copy(const char *text, char *out, size_t cap) {
  size_t k = 0;
  int blocks = 0;
  for (const char *p = text; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)n, p);
    if (!strncmp(line, "tokens ", 7))
      snprintf(line, sizeof line, "tokens tokens %d", T);
    else if (!strncmp(line, "targets ", 8))
      snprintf(line, sizeof line, "targets next %d", T);
    else if (!strncmp(line, "embedding ", 10))
      snprintf(line, sizeof line, "embedding 256 32");
    else if (!strncmp(line, "transformer_block ", 18))
      snprintf(line, sizeof line, "%s", blocks++ < 2 ? "transformer_block 2 64 causal" : "");
    else if (!strncmp(line, "schedule ", 9))
      snprintf(line, sizeof line, "schedule cosine warmup=5 decay_steps=%d min_lr=0.0001",
               STEPS - 5 - 1);
    k += (size_t)snprintf(out + k, cap - k, "%s\n", line);
    ck_assert_uint_lt(k, cap);
    p += n + (e ? 1 : 0);
  }
  ck_assert_int_eq(blocks, 4);
}

START_TEST(small_charlm_learns_a_text) {
  size_t len;
  const char *text = read_model(&len);
  static char small[8192];
  small_copy(text, small, sizeof small);
  pe_model_spec m;
  char err[512];
  ck_assert_msg(pe_model_file_parse(small, strlen(small), "charlm_small", &m, err, sizeof err) == 0,
                "%s", err);
  pe_program *p = compile(&m);
  pe_scope *scope = pe_scope_new(NULL);
  pe_exec_opts eo = {.seed = 5, .threads = 1};
  pe_seq_exec *init, *step;
  PE_CK_OK(pe_seq_exec_new(p, p->startup_block, scope, &eo, &init));
  PE_CK_OK(pe_seq_exec_run(init, NULL, 0, NULL, 0, NULL));
  pe_seq_exec_free(init);
  PE_CK_OK(pe_seq_exec_new(p, p->main_block, scope, &eo, &step));
  static const char corpus[] =
      "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy "
      "dog. the quick brown fox jumps over the lazy dog. pack my box with five dozen liquor "
      "jugs. pack my box with five dozen liquor jugs. the quick brown fox jumps over the "
      "lazy dog. pack my box with five dozen liquor jugs.";
  const int64_t n = (int64_t)strlen(corpus);
  static int64_t tok[BATCH * T], next[BATCH * T];
  const char *fetch[] = {m.loss, m.accuracy};
  double first = 0, last = 0, acc = 0;
  uint64_t counter = 0;
  for (int s = 0; s < STEPS; s++) {
    /* windows of T + 1 bytes: the first T are the tokens, the next T the targets */
    for (int b = 0; b < BATCH; b++) {
      int64_t at = (int64_t)(pe_rng_uniform(7, counter++) * (double)(n - T - 1));
      for (int t = 0; t < T; t++) {
        tok[b * T + t] = (unsigned char)corpus[at + t];
        next[b * T + t] = (unsigned char)corpus[at + t + 1];
      }
    }
    pe_tensor tt, nt;
    pe_tensor_init(&tt);
    pe_tensor_init(&nt);
    pe_shape bs = PE_SHAPE(BATCH, T);
    pe_tensor_view(&tt, PE_I64, &bs, tok);
    pe_tensor_view(&nt, PE_I64, &bs, next);
    pe_feed feeds[2] = {{m.image, &tt}, {m.label, &nt}};
    const pe_tensor *out[2];
    PE_CK_OK(pe_seq_exec_run(step, feeds, 2, fetch, 2, out));
    float l = pe_f32(out[0])[0];
    ck_assert_msg(isfinite(l), "loss %f at step %d", l, s);
    if (s < 10) first += l / 10;
    if (s >= STEPS - 10) last += l / 10, acc += pe_f32(out[1])[0] / 10;
  }
  fprintf(stderr, "train_charlm: loss %.4f -> %.4f nats/byte, accuracy %.3f in %d steps\n", first,
          last, acc, STEPS);
  ck_assert_msg(first > 4.5, "first loss %.4f: not near ln 256 at initialisation", first);
  ck_assert_msg(last < first / 3, "loss went from %.4f to %.4f", first, last);
  pe_seq_exec_free(step);
  pe_scope_free(scope);
  pe_program_free(p);
  pe_model_spec_release(&m);
}
END_TEST

static Suite *charlm_suite(void) {
  Suite *s = suite_create("train_charlm");
  TCase *tc = tcase_create("charlm");
  tcase_add_test(tc, charlm_file_builds_and_validates);
  tcase_add_test(tc, small_charlm_learns_a_text);
  suite_add_tcase(s, tc);
  return s;
}

PE_CHECK_MAIN(charlm_suite)
