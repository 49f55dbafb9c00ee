/* A worker's results written into its tensor (worker/op.py's take_results and worker/stream.py's apply, the same
 * decisions to the bit): per result, the agreed exponent it brings, then the block's values dequantized and
 * divided by the contributors for an average (int32: copied, or divided toward zero), contributor counts, done
 * marks.
 * take_results: results already matched to their packets (Op.take_results);
 * take_batch:    a received batch of RESULT packets of ops in flight, matched here (offset and phase to packet,
 *                the first result of a packet in the batch, not taken twice, of the block's size); a batch with
 *                anything else (another job, an op not in flight, OLD, a control packet) is left to Python. */
#include "worker.h"

#define MAX_OPS 16 /* ops one batch may touch here (more: left to Python) */

/* A block's results: the int32 sums divided by scale x divisor, as float32 */
static void dequantize_block(float *restrict out, const i32u *restrict values, int64_t n, double divisor) {
    for (int64_t j = 0; j < n; j++)
        out[j] = (float)((double)values[j] / divisor);
}

/* Result `d` (of `available` bytes) for packet q: NULL, or what is wrong. No Python API: runs without the GIL. */
static const char *take_one(OpView *v, const uint8_t *d, int64_t q, int64_t available, long *timed_out) {
    if (q < 0 || q >= v->prologue + v->blocks || available < HEADER_BYTES)
        return "take_results: a result outside the op or the buffer";
    if (v->quantized && q < v->blocks)
        v->agreed[q] = (int8_t)d[H_NEXT_EXPONENT];
    *timed_out += (rd16(d + H_FLAGS) & (F_TIMEOUT | F_K_REACHED)) != 0;
    v->done[q] = 1;
    if (q < v->prologue)
        return NULL;
    int64_t block = q - v->prologue, width = v->n - block * v->k < v->k ? v->n - block * v->k : v->k;
    if (available < HEADER_BYTES + 4 * width)
        return "take_results: a result shorter than its block";
    int contributors = rd16(d + H_CONTRIBUTORS);
    const i32u *values = (const i32u *)(d + HEADER_BYTES);
    v->contributors[block] = contributors;
    if (v->quantized) {
        double divisor = scale(v->world, (int8_t)d[H_EXPONENT]) * (double)(v->average ? contributors : 1);
        dequantize_block((float *)v->array + block * v->k, values, width, divisor);
        return NULL;
    }
    int32_t *out = (int32_t *)v->array + block * v->k;
    if (!v->average)
        memcpy(out, d + HEADER_BYTES, 4 * width);
    else if (contributors == 0) /* never from a switch; numpy's cast of the infinite quotient */
        for (int64_t j = 0; j < width; j++)
            out[j] = INT32_MIN;
    else /* C's division truncates toward zero: what op.truncated_average computes */
        for (int64_t j = 0; j < width; j++)
            out[j] = values[j] / contributors;
    return NULL;
}

PyObject *fp_take_results(PyObject *self, PyObject *args) {
    PyObject *op, *buffer_obj, *offsets_obj, *q_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &op, &buffer_obj, &offsets_obj, &q_obj))
        return NULL;
    OpView v;
    if (op_view(&v, op) < 0)
        return NULL;
    Py_buffer vb, vo, vq;
    int got = 0;
    const uint8_t *buffer = array_of(buffer_obj, &vb, 1, 0, 0, 'u');
    got += buffer != NULL;
    int64_t *offsets = buffer ? array_of(offsets_obj, &vo, 8, 0, 0, 'i') : NULL;
    got += offsets != NULL;
    Py_ssize_t count = offsets ? vo.len / 8 : 0;
    int64_t *q = offsets ? array_of(q_obj, &vq, 8, count, 0, 'i') : NULL;
    got += q != NULL;
    PyObject *result = NULL;
    if (q != NULL) {
        long timed_out = 0;
        const char *problem = NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count && !problem; i++)
            problem = offsets[i] < 0 ? "take_results: a result outside the buffer"
                                     : take_one(&v, buffer + offsets[i], q[i], vb.len - offsets[i], &timed_out);
        Py_END_ALLOW_THREADS
        if (problem)
            PyErr_SetString(PyExc_ValueError, problem);
        else
            result = PyLong_FromLong(timed_out);
    }
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vq);
    op_release(&v);
    return result;
}

/* Packet index of a result in its op (-1: it does not fit the op), as Op.packets_of */
static int64_t packet_of(const OpView *v, const uint8_t *d) {
    int prologue = (rd16(d + H_FLAGS) & F_PROLOGUE) != 0;
    int64_t offset = rd32(d + H_OFFSET), block = offset / v->k;
    if (offset % v->k || block >= v->blocks || (prologue && (block >= v->prologue || !v->quantized)))
        return -1;
    return prologue ? block : v->prologue + block;
}

PyObject *fp_take_batch(PyObject *self, PyObject *args) {
    PyObject *ops, *buffer_obj, *offsets_obj, *lengths_obj, *out_obj;
    unsigned long job;
    long long tag;
    if (!PyArg_ParseTuple(args, "O!OOOkLO", &PyDict_Type, &ops, &buffer_obj, &offsets_obj, &lengths_obj, &job, &tag,
                          &out_obj))
        return NULL;
    Py_buffer vb, vo, vl, vx;
    int got = 0, views = 0;
    OpView v[MAX_OPS];
    PyObject *objects[MAX_OPS];
    uint32_t ids[MAX_OPS];
    const uint8_t *buffer = array_of(buffer_obj, &vb, 1, 0, 0, 'u');
    got += buffer != NULL;
    int64_t *offsets = buffer ? array_of(offsets_obj, &vo, 8, 0, 0, 'i') : NULL;
    got += offsets != NULL;
    Py_ssize_t count = offsets ? vo.len / 8 : 0;
    int64_t *lengths = offsets ? array_of(lengths_obj, &vl, 8, count, 0, 'i') : NULL;
    got += lengths != NULL;
    int64_t *out = lengths ? array_of(out_obj, &vx, 8, count, 1, 'i') : NULL;
    got += out != NULL;
    uint8_t *which = out ? PyMem_Malloc(count > 0 ? count : 1) : NULL;
    PyObject *result = NULL;
    if (which == NULL) {
        if (out)
            PyErr_NoMemory();
        goto done;
    }
    int simple = 1;
    for (Py_ssize_t i = 0; i < count && simple; i++) { /* pass 1: every datagram a result of an op in flight */
        const uint8_t *d = buffer + offsets[i];
        simple = offsets[i] >= 0 && offsets[i] + (lengths[i] > HEADER_BYTES ? lengths[i] : HEADER_BYTES) <= vb.len &&
                 header_valid(d, lengths[i]) && d[H_TYPE] == T_RESULT && rd32(d + H_JOB) == (uint32_t)job &&
                 !(rd16(d + H_FLAGS) & F_OLD);
        uint32_t id = simple ? rd32(d + H_OP) : 0;
        int at = 0;
        while (simple && at < views && ids[at] != id)
            at++;
        if (simple && at == views) {
            PyObject *key = PyLong_FromUnsignedLong(id);
            PyObject *op = key ? PyDict_GetItemWithError(ops, key) : NULL;
            Py_XDECREF(key);
            if (PyErr_Occurred())
                goto done;
            simple = op != NULL && views < MAX_OPS;
            if (simple && op_view(&v[views], op) < 0)
                goto done;
            if (simple)
                ids[views] = id, objects[views++] = op;
        }
        which[i] = (uint8_t)at;
    }
    if (!simple) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    long timed_out[MAX_OPS] = {0}, taken_of[MAX_OPS] = {0}, duplicates = 0;
    Py_ssize_t taken = 0;
    const char *problem = NULL;
    Py_BEGIN_ALLOW_THREADS /* pass 2: Op.take_results of each fresh result, as Stream.apply decides */
    for (Py_ssize_t i = 0; i < count && !problem; i++) {
        OpView *o = &v[which[i]];
        const uint8_t *d = buffer + offsets[i];
        int64_t q = packet_of(o, d);
        if (q < 0 || o->stamp[q] == tag || o->done[q]) { /* foreign, a second copy in this batch, or done */
            duplicates++;
            if (q >= 0)
                o->stamp[q] = tag;
            continue;
        }
        o->stamp[q] = tag;
        int64_t block = q - o->prologue;
        int64_t size = q < o->prologue ? 0 : (o->n - block * o->k < o->k ? o->n - block * o->k : o->k);
        if (rd16(d + H_COUNT) != size) /* Op.results_fit */
            continue;
        problem = take_one(o, d, q, vb.len - offsets[i], &timed_out[which[i]]);
        taken_of[which[i]]++;
        out[taken++] = o->base + q;
    }
    Py_END_ALLOW_THREADS
    for (int at = 0; at < views && !problem; at++) { /* the ops' counts, as Op.take_results keeps them */
        int failed = 0;
        const char *names[] = {"remaining", "timed_out_blocks"};
        long deltas[] = {-taken_of[at], timed_out[at]};
        for (int f = 0; f < 2 && !failed; f++) {
            PyObject *before = PyObject_GetAttrString(objects[at], names[f]);
            PyObject *after = before ? PyLong_FromLongLong(PyLong_AsLongLong(before) + deltas[f]) : NULL;
            failed = after == NULL || PyErr_Occurred() || PyObject_SetAttrString(objects[at], names[f], after) < 0;
            Py_XDECREF(before);
            Py_XDECREF(after);
        }
        if (failed)
            goto done;
    }
    if (problem)
        PyErr_SetString(PyExc_ValueError, problem);
    else
        result = Py_BuildValue("nl", taken, duplicates);
done:
    PyMem_Free(which);
    for (int at = 0; at < views; at++)
        op_release(&v[at]);
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vl);
    if (got > 3) PyBuffer_Release(&vx);
    return result;
}
