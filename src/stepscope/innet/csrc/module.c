/* The `stepscope.innet._fastpath` module: its functions and the helpers every part shares (fastpath.h). */
#include "fastpath.h"

static int of_kind(const char *format, char kind) {
    const char *kinds = kind == 'i' ? "bhilq" : kind == 'u' ? "BHILQ" : kind == 'f' ? "efd" : kind == '?' ? "?" : NULL;
    if (kinds == NULL)
        return 1;
    size_t length = format ? strlen(format) : 0;
    return length > 0 && strchr(kinds, format[length - 1]) != NULL;
}

void *array_of(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t items, int writable, char kind) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    if (view->itemsize != itemsize || view->len < items * itemsize || !of_kind(view->format, kind)) {
        PyErr_Format(PyExc_ValueError, "fast path: expected %zd items of %zd bytes (kind %c), got %zd bytes of %zd-byte items (%s)",
                     items, itemsize, kind ? kind : '*', view->len, view->itemsize, view->format ? view->format : "?");
        PyBuffer_Release(view);
        return NULL;
    }
    return view->buf;
}

void write_header(uint8_t *d, int type, uint32_t job, uint32_t op, uint32_t offset, uint16_t slot, uint16_t rank,
                  uint16_t world,
                  uint16_t flags, uint16_t count, uint16_t contributors, int8_t exponent, int8_t next_exponent,
                  uint8_t op_flags) {
    d[0] = 'I';
    d[1] = 'N';
    d[H_VERSION] = 1;
    d[H_TYPE] = (uint8_t)type;
    wr32(d + H_JOB, job);
    wr32(d + H_OP, op);
    wr32(d + H_OFFSET, offset);
    wr16(d + H_SLOT, slot);
    wr16(d + H_RANK, rank);
    wr16(d + H_WORLD, world);
    wr16(d + H_FLAGS, flags);
    wr16(d + H_COUNT, count);
    wr16(d + H_CONTRIBUTORS, contributors);
    d[H_EXPONENT] = (uint8_t)exponent;
    d[H_NEXT_EXPONENT] = (uint8_t)next_exponent;
    d[H_OP_FLAGS] = op_flags;
    d[H_RESERVED] = 0;
}

static PyMethodDef methods[] = {
    {"recv_batch", fp_recv_batch, METH_VARARGS,
     "recv_batch(fd, buffer, messages, message_bytes, gro, offsets, lengths, sources) -> datagrams, or -errno"},
    {"send_batch", fp_send_batch, METH_VARARGS,
     "send_batch(fd, pointers, lengths, destinations, count, names, gso) -> (sent, dropped, gso, errno)"},
    {"switch_batch", fp_switch_batch, METH_VARARGS,
     "switch_batch(jobs, buffer, offsets, lengths, sources, start, now, outbox, scratch, fill) -> "
     "(next, stop, switch_bad)"},
    {"switch_drain", fp_switch_drain, METH_VARARGS,
     "switch_drain(fd, jobs, buffer, messages, message_bytes, gro, offsets, lengths, sources, outbox, scratch, fill, "
     "names, gso, rounds) -> (stop, count, next, received, switch_bad, sent, dropped, gso, errno)"},
    {"block_exponents", fp_block_exponents, METH_VARARGS,
     "block_exponents(values, k, out) -> 0, 1 (inf or nan) or 2 (|x| >= 2**127)"},
    {"build_packets", fp_build_packets, METH_VARARGS, "build_packets(op, q, out, rows, versions, job, rank, lengths, "
     "clipped) -> packets clipped, or -1 (a data block without its agreed exponent)"},
    {"take_results", fp_take_results, METH_VARARGS,
     "take_results(op, buffer, offsets, q) -> blocks completed by timeout or fastest-K"},
    {"take_batch", fp_take_batch, METH_VARARGS, "take_batch(ops, buffer, offsets, lengths, job, tag, out) -> "
     "(results taken, duplicates), their stream indices in out; None: a batch for Python's Stream.apply"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "stepscope's C fast path of the innet data path (csrc/fastpath.h says what is where).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&SwitchJobStateType) < 0 || switch_state_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SwitchJobStateType);
    if (PyModule_AddObject(m, "SwitchJobState", (PyObject *)&SwitchJobStateType) < 0) {
        Py_DECREF(&SwitchJobStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
