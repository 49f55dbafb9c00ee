/* A worker's blocks (worker/op.py, same arithmetic as wire/quantize.py to the bit):
 * block_exponents: per block of k values, the smallest e with |x| < 2^e (frexp of the largest magnitude);
 * build_packets:   packets of an op written into rows of the send window: header, then the block's values,
 *                  float32 quantized with the agreed exponent (round half to even, clipped to +-INT32_MAX / n)
 *                  or int32 copied;
 * (the results: worker_results.c).
 * The quantization is exact against numpy because every step is one IEEE operation in the same order
 * (float32 -> float64, multiply, round, clip; int -> float64, divide by scale x divisor, -> float32), and the
 * build refuses contraction into fused multiply-adds (-ffp-contract=off). */
#include "worker.h"

#define MIN_EXPONENT (-126)
#define MAX_EXPONENT 127

/* A block's quantized values: round(x * f) clipped to +-limit, as int32. Clipping first gives what rounding first
 * gives (the limit is whole); rounding half to even by adding and removing 1.5 x 2^52 (the default rounding
 * mode does it for |y| < 2^51). Without branches, so the loop vectorizes; a nan stays nan through the clip and
 * becomes INT32_MIN, what numpy's int32 cast gives on x86. */
static void quantize_block(int32_t *restrict out, const float *restrict x, int64_t n, double f, double limit) {
    const double magic = 6755399441055744.0;
    for (int64_t j = 0; j < n; j++) {
        double y = (double)x[j] * f;
        y = y > limit ? limit : y;
        y = y < -limit ? -limit : y;
        double whole = (y + magic) - magic;
        int32_t word = (int32_t)(y == y ? whole : 0.0);
        out[j] = y == y ? word : INT32_MIN;
    }
}

/* The largest |x| of a block; `bad` set where one is inf or nan. Compared as bit patterns: the magnitudes of
 * floats order as their bits do, inf and nan above every finite one (an integer max: vectorizes). */
static float largest_magnitude(const float *restrict x, Py_ssize_t n, int *bad) {
    uint32_t largest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        bits &= 0x7FFFFFFFu;
        largest = bits > largest ? bits : largest;
    }
    *bad |= largest >= 0x7F800000u;
    float out;
    memcpy(&out, &largest, 4);
    return out;
}

PyObject *fp_block_exponents(PyObject *self, PyObject *args) {
    PyObject *values_obj, *out_obj;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OnO", &values_obj, &k, &out_obj))
        return NULL;
    if (k < 1)
        return PyErr_Format(PyExc_ValueError, "block_exponents: k must be positive");
    Py_buffer vv, vo;
    const float *values = array_of(values_obj, &vv, 4, 0, 0, 'f');
    if (values == NULL)
        return NULL;
    Py_ssize_t n = vv.len / 4, blocks = (n + k - 1) / k;
    int16_t *out = array_of(out_obj, &vo, 2, blocks, 1, 'i');
    if (out == NULL) {
        PyBuffer_Release(&vv);
        return NULL;
    }
    int bad = 0, big = 0;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        Py_ssize_t end = (b + 1) * k < n ? (b + 1) * k : n;
        float largest = largest_magnitude(values + b * k, end - b * k, &bad);
        int e;
        frexp((double)largest, &e);
        e = largest == 0.0f || e < MIN_EXPONENT ? MIN_EXPONENT : e;
        big |= e > MAX_EXPONENT;
        out[b] = (int16_t)e;
    }
    PyBuffer_Release(&vv);
    PyBuffer_Release(&vo);
    return PyLong_FromLong(bad ? 1 : big ? 2 : 0);
}

/* ---- what the loops need of an `worker.op.Op` ------------------------------------------------------------ */
void op_release(OpView *v) {
    for (int i = 0; i < VIEWS; i++)
        if (v->held & (1 << i))
            PyBuffer_Release(&v->views[i]);
}

static void *op_array(OpView *v, int index, PyObject *op, const char *name, Py_ssize_t itemsize, Py_ssize_t items,
                      char kind) {
    PyObject *array = PyObject_GetAttrString(op, name);
    if (array == NULL)
        return NULL;
    void *data = array_of(array, &v->views[index], itemsize, items, 1, kind);
    Py_DECREF(array);
    if (data)
        v->held |= 1 << index;
    return data;
}

int op_view(OpView *v, PyObject *op) {
    memset(v, 0, sizeof *v);
    const char *names[] = {"n", "k", "blocks", "prologue", "world", "op_id", "min_count", "op_flags", "quantized",
                           "average", "base"};
    int64_t *fields[] = {&v->n, &v->k, &v->blocks, &v->prologue, &v->world, &v->op_id, &v->min_count,
                         &v->op_flags, &v->quantized, &v->average, &v->base};
    for (int i = 0; i < 11; i++) {
        PyObject *value = PyObject_GetAttrString(op, names[i]);
        if (value == NULL)
            return -1;
        *fields[i] = PyLong_AsLongLong(value); /* bools are ints */
        Py_DECREF(value);
        if (*fields[i] == -1 && PyErr_Occurred())
            return -1;
    }
    int packets = (int)(v->prologue + v->blocks);
    if (!(v->array = op_array(v, V_ARRAY, op, "array", 4, v->n, v->quantized ? 'f' : 'i')) ||
        !(v->agreed = op_array(v, V_AGREED, op, "agreed", 2, v->blocks, 'i')) ||
        !(v->contributors = op_array(v, V_CONTRIBUTORS, op, "contributors", 4, v->blocks, 'i')) ||
        !(v->done = op_array(v, V_DONE, op, "done", 1, packets, '?')) ||
        !(v->stamp = op_array(v, V_STAMP, op, "stamp", 8, packets, 'i')) ||
        (v->quantized && !(v->own = op_array(v, V_OWN, op, "own_exponent", 2, v->blocks, 'i')))) {
        op_release(v);
        return -1;
    }
    return 0;
}

/* ---- packets --------------------------------------------------------------------------------------------- */
PyObject *fp_build_packets(PyObject *self, PyObject *args) {
    PyObject *op, *q_obj, *out_obj, *rows_obj, *versions_obj, *lengths_obj, *clipped_obj;
    unsigned long job;
    int rank;
    if (!PyArg_ParseTuple(args, "OOOOOkiOO", &op, &q_obj, &out_obj, &rows_obj, &versions_obj, &job, &rank,
                          &lengths_obj, &clipped_obj))
        return NULL;
    OpView v;
    if (op_view(&v, op) < 0)
        return NULL;
    Py_buffer vq, vo, vr, vv, vl, vc;
    int got = 0;
    int64_t *q = array_of(q_obj, &vq, 8, 0, 0, 'i');
    got += q != NULL;
    Py_ssize_t count = q ? vq.len / 8 : 0, stride = HEADER_BYTES + 4 * v.k;
    uint8_t *out = q ? array_of(out_obj, &vo, 1, 0, 1, 'u') : NULL;
    got += out != NULL;
    int64_t *rows = out ? array_of(rows_obj, &vr, 8, count, 0, 'i') : NULL;
    got += rows != NULL;
    int64_t *versions = rows ? array_of(versions_obj, &vv, 8, count, 0, 'i') : NULL;
    got += versions != NULL;
    int64_t *lengths = versions ? array_of(lengths_obj, &vl, 8, count, 1, 'i') : NULL;
    got += lengths != NULL;
    uint8_t *clipped = lengths ? array_of(clipped_obj, &vc, 1, count, 1, 0) : NULL;
    got += clipped != NULL;
    PyObject *result = NULL;
    if (clipped == NULL)
        goto done;
    long late = 0;
    int outside = 0;
    Py_BEGIN_ALLOW_THREADS /* the loops touch no Python object: a sender thread builds while others run */
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t qi = q[i], row = rows[i];
        if (qi < 0 || qi >= v.prologue + v.blocks || row < 0 || (row + 1) * stride > vo.len) {
            outside = 1;
            break;
        }
        int prologue = qi < v.prologue;
        int64_t block = prologue ? qi : qi - v.prologue;
        int64_t n = prologue ? 0 : (v.n - block * v.k < v.k ? v.n - block * v.k : v.k);
        int exponent = v.quantized && !prologue ? v.agreed[block] : 0;
        int next = v.quantized && qi < v.blocks ? v.own[qi] : NO_EXPONENT;
        uint8_t *d = out + row * stride;
        write_header(d, T_DATA, (uint32_t)job, (uint32_t)v.op_id, (uint32_t)(block * v.k), (uint16_t)row,
                     (uint16_t)rank, (uint16_t)v.world, (uint16_t)(versions[i] | (prologue ? F_PROLOGUE : 0)),
                     (uint16_t)n, (uint16_t)v.min_count, (int8_t)exponent, (int8_t)next, (uint8_t)v.op_flags);
        lengths[i] = HEADER_BYTES + 4 * n;
        clipped[i] = 0;
        if (prologue)
            continue;
        int32_t *words = (int32_t *)(d + HEADER_BYTES);
        if (!v.quantized) {
            memcpy(words, (int32_t *)v.array + block * v.k, 4 * n);
            continue;
        }
        if (exponent == NO_EXPONENT) { /* the caller raises quantize.QuantizationError */
            late = -1;
            break;
        }
        clipped[i] = v.own[block] > exponent; /* its largest value does not fit the agreed range */
        late += clipped[i];
        const float *x = (const float *)v.array + block * v.k;
        double f = scale(v.world, exponent), limit = (double)(2147483647 / v.world);
        quantize_block(words, x, n, f, limit);
    }
    Py_END_ALLOW_THREADS
    if (outside) {
        PyErr_SetString(PyExc_ValueError, "build_packets: a packet or row outside the op or the window");
        goto done;
    }
    result = PyLong_FromLong(late);
done:
    if (got > 0) PyBuffer_Release(&vq);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vr);
    if (got > 3) PyBuffer_Release(&vv);
    if (got > 4) PyBuffer_Release(&vl);
    if (got > 5) PyBuffer_Release(&vc);
    op_release(&v);
    return result;
}
