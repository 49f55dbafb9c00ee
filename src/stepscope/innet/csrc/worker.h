/* A worker's side of the fast path, shared by worker_blocks.c (exponents, packets) and worker_results.c
 * (results into the tensor). */
#ifndef STEPSCOPE_WORKER_H
#define STEPSCOPE_WORKER_H

#include "fastpath.h"

#include <math.h>

#define INT32_MAX_ 2147483647.0

/* f = INT32_MAX / (n * 2^e), as quantize.scales computes it */
static inline double scale(int64_t world, int exponent) { return INT32_MAX_ / ((double)world * ldexp(1.0, exponent)); }

/* what the loops need of a `worker.op.Op` */
enum { V_ARRAY, V_AGREED, V_OWN, V_CONTRIBUTORS, V_DONE, V_STAMP, VIEWS };
typedef struct {
    Py_buffer views[VIEWS];
    int held;
    void *array;
    int16_t *agreed, *own;
    int32_t *contributors;
    uint8_t *done;
    int64_t *stamp;
    int64_t n, k, blocks, prologue, world, op_id, min_count, op_flags, quantized, average, base;
} OpView;

int op_view(OpView *v, PyObject *op); /* -1 with a Python error set */
void op_release(OpView *v);

#endif
