/* Model definitions shared by pe-bench and the tests, built with the program
 * builder for 28x28 one-channel images and 10 classes (Fashion-MNIST).
 *
 *   mlp  784-256-128-10, relu; momentum SGD lr 0.1, mu 0.9; batch 128.
 *   cnn  conv5x5x32 pad 2, relu, maxpool2, conv5x5x64 pad 2, relu, maxpool2,
 *        fc1024, relu, dropout 0.4, fc10; momentum SGD lr 0.01, mu 0.9;
 *        batch 64.
 *
 * Both: loss = mean(softmax_with_cross_entropy(logits, label)) and a top-1
 * accuracy op. Feeds: "image" (f32 [-1,784] for mlp, [-1,1,28,28] for cnn)
 * and "label" (i64 [-1,1]). The program carries the loss and the optimizer
 * in its TrainSpec; the daemon's passes add gradients and updates. */
#ifndef PE_MODELS_H
#define PE_MODELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PE_MODEL_NAME_LEN 64

/* A feed as the program declares it (dims with -1 for the batch); ndim 0:
 * not known. */
typedef struct pe_model_feed {
  int dtype; /* pe_b_dtype */
  int ndim;
  int64_t dims[8];
} pe_model_feed;

typedef struct pe_model_spec {
  char name[PE_MODEL_NAME_LEN];
  uint8_t *bytes; /* ProgramDesc, owned (pe_model_spec_release) */
  size_t len;
  char image[PE_MODEL_NAME_LEN]; /* feed names */
  char label[PE_MODEL_NAME_LEN];
  char loss[PE_MODEL_NAME_LEN];     /* fetch: mean loss, f32 [1] */
  char accuracy[PE_MODEL_NAME_LEN]; /* fetch: batch accuracy, f32 [1] */
  char correct[PE_MODEL_NAME_LEN];  /* fetch: correct predictions, i64 [1] */
  int image_ndim;
  int64_t image_dims[4]; /* with -1 for the batch */
  int image_dtype;       /* pe_b_dtype of the image feed: 0 f32; 3 i64 token ids */
  int64_t label_len;     /* 0: the label is i64 [-1, 1]; T: i64 [-1, T], one per position */
  int default_batch;
  int accuracy_top_k; /* the accuracy's K (top-K; 0 read as 1) */
  /* The program's optimizer (pe_program_optimizer's answer, the recipe's
   * when pe_model_opts gave one): sgd, momentum, adam, adamw; "" none. */
  char optimizer[16];
  /* The image and label feeds' declarations, known before the program is
   * packed (pe_model_opts.prepare reads them to check a trainer's data). */
  pe_model_feed image_feed, label_feed;
} pe_model_spec;

/* Build model `name`. Returns 0, or -1 with a message in err (unknown
 * name: lists the known ones). */
int pe_model_spec_build(const char *name, pe_model_spec *out, char *err, size_t errlen);
void pe_model_spec_release(pe_model_spec *m);
/* "mlp|cnn" */
const char *pe_model_spec_names(void);

#ifdef __cplusplus
}
#endif

#endif
