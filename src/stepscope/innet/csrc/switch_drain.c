/* The switch's receive loop: receive a batch (recvmmsg), apply its DATA packets (run_batch), send what they
 * cause (sendmmsg), again until the socket is empty or `rounds` batches are done, in one call: the Python
 * switch pays its per-batch overhead once per wakeup instead of per batch. A control packet stops the loop:
 * the batch's datagrams stay in the caller's arrays, and the caller answers the control packet and applies the
 * rest of the batch (switch/fast_batch.py). The clock is Python's time.monotonic (CLOCK_MONOTONIC). */
#include "switch.h"

#include <time.h>

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

PyObject *fp_switch_drain(PyObject *self, PyObject *args) {
    int fd, messages, gro, gso, rounds;
    Py_ssize_t message_bytes;
    PyObject *jobs, *buffer_obj, *offsets_obj, *lengths_obj, *sources_obj, *entries_obj, *scratch_obj, *fill_obj,
        *names_obj;
    if (!PyArg_ParseTuple(args, "iO!OinpOOOOOOOpi", &fd, &PyDict_Type, &jobs, &buffer_obj, &messages,
                          &message_bytes, &gro, &offsets_obj, &lengths_obj, &sources_obj, &entries_obj, &scratch_obj,
                          &fill_obj, &names_obj, &gso, &rounds))
        return NULL;
    if (messages < 1 || messages > MAX_MESSAGES || message_bytes < 1)
        return PyErr_Format(PyExc_ValueError, "switch_drain: 1..%d messages", MAX_MESSAGES);
    Py_buffer vb, vo, vl, vs, vn;
    Outbox o;
    int got = 0;
    uint8_t *buffer = array_of(buffer_obj, &vb, 1, messages * message_bytes, 1, 'u');
    got += buffer != NULL;
    int64_t *offsets = buffer ? array_of(offsets_obj, &vo, 8, (Py_ssize_t)messages * GRO_SEGMENTS, 1, 'i') : NULL;
    got += offsets != NULL;
    int64_t *lengths = offsets ? array_of(lengths_obj, &vl, 8, vo.len / 8, 1, 'i') : NULL;
    got += lengths != NULL;
    uint64_t *sources = lengths ? array_of(sources_obj, &vs, 8, vo.len / 8, 1, 'u') : NULL;
    got += sources != NULL;
    uint8_t *names = sources ? array_of(names_obj, &vn, 1, 0, 0, 'u') : NULL;
    got += names != NULL;
    got += names != NULL && outbox_open(&o, entries_obj, scratch_obj, fill_obj) == 0;
    if (got < 6)
        goto release;
    int stop = STOP_END, error = 0, failed = 0;
    Py_ssize_t count = 0, next = 0;
    long long received = 0, switch_bad = 0, sent = 0, dropped = 0;
    for (int round = 0; round < rounds && !failed && !error && stop != STOP_CONTROL; round++) {
        Py_BEGIN_ALLOW_THREADS
        count = recv_into(fd, buffer, messages, message_bytes, gro, offsets, lengths, sources, vo.len / 8);
        Py_END_ALLOW_THREADS
        if (count <= 0) {
            error = count < 0 ? (int)-count : 0;
            count = 0;
            break;
        }
        received += count;
        double now = monotonic();
        for (next = 0;;) {
            next = run_batch(jobs, buffer, vb.len, offsets, lengths, sources, count, next, now, &o, &stop, &switch_bad);
            failed = next < 0;
            long long out = 0, lost = 0;
            int code = 0, no_memory = 0;
            Py_BEGIN_ALLOW_THREADS /* what the batch caused so far, in packet order, even when it failed */
            no_memory = send_queue(fd, (uint64_t *)o.pointer, o.length, o.dest, o.entries, names, &gso, &out, &lost,
                                   &code);
            Py_END_ALLOW_THREADS
            sent += out, dropped += lost;
            o.entries = o.used = 0;
            o.generation++;
            if (no_memory && !failed) {
                PyErr_NoMemory();
                failed = 1;
            }
            error = error ? error : code;
            if (failed || error || stop != STOP_FULL)
                break;
        }
    }
    outbox_close(&o);
    PyObject *result = NULL;
    if (!failed)
        result = Py_BuildValue("innLLLLii", stop, count, next, received, switch_bad, sent, dropped, gso, error);
    PyBuffer_Release(&vb);
    PyBuffer_Release(&vo);
    PyBuffer_Release(&vl);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&vn);
    return result;
release:
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vl);
    if (got > 3) PyBuffer_Release(&vs);
    if (got > 4) PyBuffer_Release(&vn);
    return NULL;
}
