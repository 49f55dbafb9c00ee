/* stepscope's C fast path for the in-network aggregation data path (`stepscope.innet._fastpath`).
 *
 * What is here: the per-datagram loops that cost microseconds each in Python/numpy (docs/innet.md):
 *   mmsg_io.c       recvmmsg into a preallocated buffer (GRO trains cut into datagrams), sendmmsg of a queue
 *                   (GSO trains of equal-size datagrams to one peer);
 *   switch_batch.c  the switch's DATA packets of a received batch, one at a time in arrival order: header
 *                   checks, per-row int32 sums, completion, result datagrams, answers (the protocol's
 *                   definition, as tests/innet/switch_reference.py writes it);
 *   worker_blocks.c a worker's packets built from its tensor (quantized) and results written into it.
 * The state stays in the numpy arrays the Python code owns (switch.job.SwitchJob, worker.op.Op): both paths
 * read and write the same arrays, so the Python timers, control packets and tests see one state.
 *
 * Layout of a datagram (wire/protocol.py): 32-byte little-endian header, then int32 values. */
#ifndef STEPSCOPE_FASTPATH_H
#define STEPSCOPE_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the innet wire format is little-endian; this fast path reads it in place"
#endif

/* header fields: byte offsets */
enum { H_MAGIC = 0, H_VERSION = 2, H_TYPE = 3, H_JOB = 4, H_OP = 8, H_OFFSET = 12, H_SLOT = 16, H_RANK = 18,
       H_WORLD = 20, H_FLAGS = 22, H_COUNT = 24, H_CONTRIBUTORS = 26, H_EXPONENT = 28, H_NEXT_EXPONENT = 29,
       H_OP_FLAGS = 30, H_RESERVED = 31, HEADER_BYTES = 32 };
enum { T_DATA = 1, T_RESULT = 2, T_STATUS = 6, T_LAST = 8 };
enum { F_VERSION = 0x1, F_RETRANSMIT = 0x2, F_PROLOGUE = 0x4, F_TIMEOUT = 0x8, F_K_REACHED = 0x10, F_OLD = 0x20,
       F_SERVED = 0x100 };
enum { OP_AVERAGE = 0x1, OP_QUANTIZED = 0x2, OP_PREEMPTIVE = 0x4 };
#define SWITCH_RANK 0xFFFF
#define NO_EXPONENT (-128)
#define MAX_OFFSET 0x7FFFFFFFu

/* int32 values at any byte offset (a GRO train may leave a datagram at an odd one) */
typedef int32_t i32u __attribute__((aligned(1), may_alias));

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* A version-1 header of a datagram of `length` bytes: magic, version, known type, reserved 0, length matches
 * the count (protocol.unpack's checks). */
static inline int header_valid(const uint8_t *d, int64_t length) {
    return length >= HEADER_BYTES && d[0] == 'I' && d[1] == 'N' && d[H_VERSION] == 1 && d[H_TYPE] >= T_DATA &&
           d[H_TYPE] <= T_LAST && d[H_RESERVED] == 0 && length == HEADER_BYTES + 4 * (int64_t)rd16(d + H_COUNT);
}

/* Write a whole header (the switch's answers: rank SWITCH_RANK). */
void write_header(uint8_t *d, int type, uint32_t job, uint32_t op, uint32_t offset, uint16_t slot, uint16_t rank,
                  uint16_t world,
                  uint16_t flags, uint16_t count, uint16_t contributors, int8_t exponent, int8_t next_exponent,
                  uint8_t op_flags);

/* A numpy array (or any buffer) as C-contiguous memory of at least `items` items of `itemsize` bytes and of
 * `kind` ('i' signed, 'u' unsigned, 'f' floating, '?' bool, 0: any); sets a Python error and returns NULL
 * otherwise. The view must be released with PyBuffer_Release. */
void *array_of(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t items, int writable, char kind);

/* mmsg_io.c: the system calls without the interpreter (call them with the GIL released) */
#define MAX_MESSAGES 256 /* messages one receive call takes at most */
#define GRO_SEGMENTS 128 /* the most datagrams the kernel puts in one received message (batch_io.GRO_SEGMENTS) */
/* one recvmmsg: the datagrams' offsets, lengths (-1: cut short) and sources; their count, or -errno */
Py_ssize_t recv_into(int fd, uint8_t *buffer, int messages, Py_ssize_t message_bytes, int gro, int64_t *offsets,
                     int64_t *lengths, uint64_t *sources, Py_ssize_t capacity);
/* send a queue (reordered in place, by destination); -1 when out of memory; *code: ECONNREFUSED or 0 */
int send_queue(int fd, uint64_t *ptr, int64_t *length, int64_t *dest, Py_ssize_t count, const uint8_t *names,
               int *gso, long long *sent, long long *dropped, int *code);
PyObject *fp_recv_batch(PyObject *self, PyObject *args);
PyObject *fp_send_batch(PyObject *self, PyObject *args);
/* switch_state.c, switch_batch.c, switch_drain.c */
extern PyTypeObject SwitchJobStateType;
PyObject *fp_switch_batch(PyObject *self, PyObject *args);
PyObject *fp_switch_drain(PyObject *self, PyObject *args);
int switch_state_init(void);
/* worker_blocks.c, worker_results.c */
PyObject *fp_block_exponents(PyObject *self, PyObject *args);
PyObject *fp_build_packets(PyObject *self, PyObject *args);
PyObject *fp_take_results(PyObject *self, PyObject *args);
PyObject *fp_take_batch(PyObject *self, PyObject *args);

#endif
