/* The switch's side of the fast path, shared by switch_state.c (a job's state), switch_batch.c (a batch's DATA
 * packets) and switch_drain.c (receive, apply, send until the socket is empty). */
#ifndef STEPSCOPE_SWITCH_H
#define STEPSCOPE_SWITCH_H

#include "fastpath.h"

enum { C_OK, C_TO, C_KR, C_RE, C_DUP, C_OLD, C_BAD, C_SY, C_RX, C_TX, COUNTERS }; /* protocol.COUNTERS */
enum { STOP_END = 0, STOP_CONTROL = 1, STOP_FULL = 2 };

/* one job's state: views of a `switch.job.SwitchJob`'s arrays */
enum { A_USED, A_KEYS, A_COMPLETE, A_SEEN, A_COUNT, A_MIN_COUNT, A_N, A_EXPONENT, A_OP_FLAGS, A_NEXT_EXPONENT,
       A_STARTED, A_DEADLINE, A_TIMER_ORDER, A_EXPIRED, A_DATAGRAMS, A_MEMBER_KEYS, A_MEMBER_DESTS, A_RING,
       A_RING_KEYS, A_RING_NUMBERS, ARRAYS };

typedef struct {
    PyObject_HEAD
    Py_buffer views[ARRAYS];
    int held;
    uint8_t *used, *complete, *expired, *datagrams, *ring, *op_flags;
    uint64_t *keys, *seen, *member_keys, *ring_keys;
    int64_t *count, *min_count, *n, *timer_order, *member_dests, *ring_numbers, *queued;
    int8_t *exponent, *next_exponent;
    double *started, *deadline;
    uint32_t job_id;
    int64_t world, words, slots, k, rows, stride, history;
    double sto_s;
    PyObject *counters, *history_object; /* job.counters (dict), job.history */
    /* during a call */
    int64_t delta[COUNTERS], timers_started, inserted;
} JobState;

/* what a batch sends: entries of (packet index, address, length, destination), and bytes of answers built here */
typedef struct {
    int64_t *order, *pointer, *length, *dest; /* the rows of the caller's (4, capacity) int64 array */
    Py_ssize_t entries, capacity;
    uint8_t *scratch;
    Py_ssize_t used, scratch_bytes;
    int64_t generation; /* changes whenever the caller has sent the outbox */
    int64_t *fill;      /* the caller's [entries, scratch bytes used, generation] */
    Py_buffer views[3];
} Outbox;

/* the job the batch's packets are applied to now */
typedef struct {
    PyObject *job;
    JobState *state;
    uint32_t id;
} Current;

/* The caller's outbox: a (4, capacity) int64 array (rows: packet index, address, length, destination), a byte
 * array for answers built here, and fill = [entries, bytes used, generation]; close writes the fill back. */
int outbox_open(Outbox *o, PyObject *entries, PyObject *scratch, PyObject *fill);
void outbox_close(Outbox *o);

int begin_job(Current *c, PyObject *job);  /* the job's state (made on first use) and its scalars */
int end_job(Current *c, double now);       /* counters, timers, history position back into the job */
/* Apply DATA packets `start`.. of a received batch; returns where it stopped (*stop says why), adding the
 * packets the switch counts bad to *switch_bad; -1 with a Python error set. */
Py_ssize_t run_batch(PyObject *jobs, const uint8_t *buffer, Py_ssize_t buffer_bytes, const int64_t *offsets,
                     const int64_t *lengths, const uint64_t *sources, Py_ssize_t n, Py_ssize_t start, double now,
                     Outbox *o, int *stop, long long *switch_bad);

#endif
