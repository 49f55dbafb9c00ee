/* The switch's DATA packets of one received batch, one at a time in arrival order: exactly the protocol's
 * definition (docs/innet.md; tests/innet/switch_reference.py), on the job state the Python switch owns
 * (switch/job.py: arrays over rows, row = 2 x slot + version; the running int32 sum lives in the row's result
 * datagram). What a packet causes goes to an outbox of (packet index, address, length, destination) entries:
 * a completed block's datagram to every member (multicast), a result re-served (flagged SERVED, copied), a
 * STATUS, an OLD answer. The batch stops at a control packet (the Python switch handles it) and when the
 * outbox cannot take one more packet's answers (the caller sends and calls again).
 *
 * Straggler timers are started here and fired by the Python switch (SwitchJob.expire), on the same arrays. */
#include "fastpath.h"

#include <math.h>

#define STATUS_AFTER_S 0.1 /* switch/job.py: a duplicate of a block open this long gets a STATUS */
enum { C_OK, C_TO, C_KR, C_RE, C_DUP, C_OLD, C_BAD, C_SY, C_RX, C_TX, COUNTERS };
static const char *counter_names[COUNTERS] = {"ok", "to", "kr", "re", "dup", "old", "bad", "sy", "rx", "tx"};
static PyObject *counter_keys[COUNTERS];
enum { STOP_END = 0, STOP_CONTROL = 1, STOP_FULL = 2 };

/* ---- one job's state: views of its arrays ------------------------------------------------------------ */
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

static int64_t int_attr(PyObject *obj, const char *name, int *failed) {
    PyObject *value = PyObject_GetAttrString(obj, name);
    if (value == NULL) {
        *failed = 1;
        return 0;
    }
    int64_t out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (out == -1 && PyErr_Occurred())
        *failed = 1;
    return out;
}

static void *view_attr(JobState *s, int index, PyObject *owner, const char *name, Py_ssize_t itemsize,
                       Py_ssize_t items, char kind) {
    PyObject *array = PyObject_GetAttrString(owner, name);
    if (array == NULL)
        return NULL;
    void *data = array_of(array, &s->views[index], itemsize, items, 1, kind);
    Py_DECREF(array);
    if (data != NULL)
        s->held |= 1 << index;
    return data;
}

static void state_dealloc(JobState *s) {
    for (int i = 0; i < ARRAYS; i++)
        if (s->held & (1 << i))
            PyBuffer_Release(&s->views[i]);
    PyMem_Free(s->queued);
    Py_XDECREF(s->counters);
    Py_XDECREF(s->history_object);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* SwitchJobState(job): views of a `switch.job.SwitchJob`'s arrays (it keeps no reference to the job). */
static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *job;
    if (!PyArg_ParseTuple(args, "O", &job))
        return NULL;
    JobState *s = (JobState *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    int failed = 0;
    s->job_id = (uint32_t)int_attr(job, "job_id", &failed);
    s->world = int_attr(job, "world", &failed);
    s->slots = int_attr(job, "slots", &failed);
    s->k = int_attr(job, "k", &failed);
    s->stride = int_attr(job, "stride", &failed);
    PyObject *sto = PyObject_GetAttrString(job, "sto_s");
    s->sto_s = sto ? PyFloat_AsDouble(sto) : -1.0;
    Py_XDECREF(sto);
    s->history_object = PyObject_GetAttrString(job, "history");
    s->counters = PyObject_GetAttrString(job, "counters");
    if (failed || sto == NULL || s->history_object == NULL || s->counters == NULL || !PyDict_Check(s->counters)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "SwitchJobState: not a switch job");
        Py_DECREF(s);
        return NULL;
    }
    s->history = int_attr(s->history_object, "size", &failed);
    s->rows = 2 * s->slots;
    s->words = (s->world + 63) / 64;
    Py_ssize_t rows = s->rows, hist = s->history;
    PyObject *h = s->history_object;
    if (failed || s->stride != HEADER_BYTES + 4 * s->k ||
        !(s->used = view_attr(s, A_USED, job, "used", 1, rows, '?')) ||
        !(s->keys = view_attr(s, A_KEYS, job, "keys", 8, rows, 'u')) ||
        !(s->complete = view_attr(s, A_COMPLETE, job, "complete", 1, rows, '?')) ||
        !(s->seen = view_attr(s, A_SEEN, job, "seen", 8, rows * s->words, 'u')) ||
        !(s->count = view_attr(s, A_COUNT, job, "count", 8, rows, 'i')) ||
        !(s->min_count = view_attr(s, A_MIN_COUNT, job, "min_count", 8, rows, 'i')) ||
        !(s->n = view_attr(s, A_N, job, "n", 8, rows, 'i')) ||
        !(s->exponent = view_attr(s, A_EXPONENT, job, "exponent", 1, rows, 'i')) ||
        !(s->op_flags = view_attr(s, A_OP_FLAGS, job, "op_flags", 1, rows, 'u')) ||
        !(s->next_exponent = view_attr(s, A_NEXT_EXPONENT, job, "next_exponent", 1, rows, 'i')) ||
        !(s->started = view_attr(s, A_STARTED, job, "started", 8, rows, 'f')) ||
        !(s->deadline = view_attr(s, A_DEADLINE, job, "deadline", 8, rows, 'f')) ||
        !(s->timer_order = view_attr(s, A_TIMER_ORDER, job, "timer_order", 8, rows, 'i')) ||
        !(s->expired = view_attr(s, A_EXPIRED, job, "expired", 1, rows, '?')) ||
        !(s->datagrams = view_attr(s, A_DATAGRAMS, job, "datagrams", 1, rows * s->stride, 'u')) ||
        !(s->member_keys = view_attr(s, A_MEMBER_KEYS, job, "member_keys", 8, s->world, 'u')) ||
        !(s->member_dests = view_attr(s, A_MEMBER_DESTS, job, "member_dests", 8, s->world, 'i')) ||
        !(s->ring = view_attr(s, A_RING, h, "ring", 1, hist * s->stride, 'u')) ||
        !(s->ring_keys = view_attr(s, A_RING_KEYS, h, "ring_keys", 8, hist, 'u')) ||
        !(s->ring_numbers = view_attr(s, A_RING_NUMBERS, h, "ring_numbers", 8, hist, 'i'))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "SwitchJobState: inconsistent job arrays");
        Py_DECREF(s);
        return NULL;
    }
    s->queued = PyMem_Malloc(rows * sizeof(int64_t));
    if (s->queued == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t r = 0; r < rows; r++)
        s->queued[r] = -1;
    return (PyObject *)s;
}

PyTypeObject SwitchJobStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope.innet._fastpath.SwitchJobState",
    .tp_basicsize = sizeof(JobState),
    .tp_dealloc = (destructor)state_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Views of one switch job's arrays for the C fast path.",
    .tp_new = state_new,
};

int switch_batch_init(void) {
    for (int c = 0; c < COUNTERS; c++)
        if ((counter_keys[c] = PyUnicode_InternFromString(counter_names[c])) == NULL)
            return -1;
    return 0;
}

/* ---- the outbox ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t *order, *pointer, *length, *dest; /* the rows of the caller's (4, capacity) int64 array */
    Py_ssize_t entries, capacity;
    uint8_t *scratch;
    Py_ssize_t used, scratch_bytes;
    int64_t generation; /* changes whenever the caller has sent the outbox */
} Outbox;

static void emit(Outbox *o, int64_t order, const uint8_t *data, int64_t length, int64_t dest) {
    o->order[o->entries] = order;
    o->pointer[o->entries] = (int64_t)(uintptr_t)data;
    o->length[o->entries] = length;
    o->dest[o->entries++] = dest;
}

static uint8_t *take(Outbox *o, Py_ssize_t bytes) {
    uint8_t *at = o->scratch + o->used;
    o->used += (bytes + 7) & ~(Py_ssize_t)7;
    return at;
}

/* A copy of a stored result with SERVED set, to one rank. */
static void serve(JobState *s, Outbox *o, int64_t order, const uint8_t *stored, int64_t dest) {
    int64_t length = HEADER_BYTES + 4 * (int64_t)rd16(stored + H_COUNT);
    uint8_t *copy = take(o, length);
    memcpy(copy, stored, length);
    wr16(copy + H_FLAGS, rd16(copy + H_FLAGS) | F_SERVED);
    emit(o, order, copy, length, dest);
    s->delta[C_TX]++;
}

/* ---- one job's rows ------------------------------------------------------------------------------------ */
static inline uint8_t *row_datagram(JobState *s, int64_t row) { return s->datagrams + row * s->stride; }

static void complete(JobState *s, Outbox *o, int64_t row, uint16_t flag, int64_t order) {
    uint8_t *d = row_datagram(s, row);
    uint64_t key = s->keys[row];
    int data = (key >> 31) & 1;
    write_header(d, T_RESULT, s->job_id, (uint32_t)(key >> 32), (uint32_t)(key & MAX_OFFSET), (uint16_t)(row / 2),
                 SWITCH_RANK, (uint16_t)s->world, (uint16_t)((row & 1) | (data ? 0 : F_PROLOGUE) | flag), (uint16_t)s->n[row],
                 (uint16_t)s->count[row], s->exponent[row], s->next_exponent[row], s->op_flags[row]);
    s->complete[row] = 1;
    s->deadline[row] = INFINITY;
    s->expired[row] = 0;
    s->delta[flag == 0 ? C_OK : flag == F_TIMEOUT ? C_TO : C_KR]++;
    int64_t length = HEADER_BYTES + 4 * s->n[row];
    if (s->history > 0) { /* the last `history` completed results, oldest out */
        int64_t at = s->inserted % s->history;
        memcpy(s->ring + at * s->stride, d, length);
        s->ring_keys[at] = key;
        s->ring_numbers[at] = s->inserted++;
    }
    for (int64_t r = 0; r < s->world; r++) { /* every member, in rank order */
        if (s->member_dests[r] >= 0) {
            emit(o, order, d, length, s->member_dests[r]);
            s->delta[C_TX]++;
        }
    }
    s->queued[row] = o->generation;
}

static void maybe_complete(JobState *s, Outbox *o, int64_t row, int64_t order) {
    int64_t count = s->count[row];
    if (count >= s->world)
        complete(s, o, row, 0, order);
    else if (count >= s->min_count[row] && (s->op_flags[row] & OP_PREEMPTIVE))
        complete(s, o, row, F_K_REACHED, order);
    else if (count >= s->min_count[row] && s->expired[row])
        complete(s, o, row, F_TIMEOUT, order);
}

/* The row's result datagram is queued in the outbox and the row takes a new block: the queued entries get a
 * copy (a batch whose answers are not sent yet must not see the new block's sums). */
static void keep_queued_result(JobState *s, Outbox *o, int64_t row) {
    if (s->queued[row] != o->generation)
        return;
    uint8_t *d = row_datagram(s, row);
    int64_t length = HEADER_BYTES + 4 * s->n[row];
    uint8_t *copy = take(o, length);
    memcpy(copy, d, length);
    for (Py_ssize_t e = 0; e < o->entries; e++)
        if (o->pointer[e] == (int64_t)(uintptr_t)d)
            o->pointer[e] = (int64_t)(uintptr_t)copy;
    s->queued[row] = -1;
}

static void add(JobState *s, int64_t row, const uint8_t *d, int rank, int fresh) {
    s->seen[row * s->words + rank / 64] |= (uint64_t)1 << (rank % 64);
    s->count[row]++;
    int8_t next = (int8_t)d[H_NEXT_EXPONENT];
    if (next > s->next_exponent[row])
        s->next_exponent[row] = next;
    int32_t *sums = (int32_t *)(row_datagram(s, row) + HEADER_BYTES);
    const i32u *values = (const i32u *)(d + HEADER_BYTES);
    int64_t n = s->n[row];
    if (fresh) {
        memcpy(sums, d + HEADER_BYTES, 4 * n);
    } else {
        for (int64_t j = 0; j < n; j++) /* int32 with wrap-around, like the switch's ALU */
            sums[j] = (int32_t)((uint32_t)sums[j] + (uint32_t)values[j]);
    }
}

static void status(JobState *s, Outbox *o, int64_t row, int64_t order, int64_t dest) {
    uint64_t key = s->keys[row];
    int64_t words32 = (s->world + 31) / 32;
    uint8_t *d = take(o, HEADER_BYTES + 4 * words32);
    write_header(d, T_STATUS, s->job_id, (uint32_t)(key >> 32), (uint32_t)(key & MAX_OFFSET), (uint16_t)(row / 2),
                 SWITCH_RANK, (uint16_t)s->world, (uint16_t)((row & 1) | (((key >> 31) & 1) ? 0 : F_PROLOGUE)), (uint16_t)words32,
                 (uint16_t)s->count[row], 0, NO_EXPONENT, 0);
    memcpy(d + HEADER_BYTES, s->seen + row * s->words, 4 * words32); /* the bitmap's little-endian 32-bit words */
    emit(o, order, d, HEADER_BYTES + 4 * words32, dest);
    s->delta[C_TX]++;
}

/* A packet for a block older than its row holds: the result from the history, or OLD. */
static void old(JobState *s, Outbox *o, const uint8_t *d, uint64_t key, int64_t order, int64_t dest) {
    s->delta[C_OLD]++;
    int64_t oldest = s->inserted - s->history > 0 ? s->inserted - s->history : 0, best = -1;
    for (int64_t i = 0; i < s->history; i++)
        if (s->ring_keys[i] == key && s->ring_numbers[i] >= oldest && (best < 0 || s->ring_numbers[i] > s->ring_numbers[best]))
            best = i;
    if (best >= 0) {
        serve(s, o, order, s->ring + best * s->stride, dest);
        return;
    }
    uint8_t *reply = take(o, HEADER_BYTES);
    write_header(reply, T_RESULT, s->job_id, rd32(d + H_OP), rd32(d + H_OFFSET), rd16(d + H_SLOT), SWITCH_RANK,
                 (uint16_t)s->world,
                 (rd16(d + H_FLAGS) & (F_VERSION | F_PROLOGUE)) | F_OLD | F_SERVED, 0, 0, 0, NO_EXPONENT, 0);
    emit(o, order, reply, HEADER_BYTES, dest);
    s->delta[C_TX]++;
}

/* One DATA packet of a member of the job (its world and rank checked); returns 1 when the switch counts it bad. */
static int contribute(JobState *s, Outbox *o, const uint8_t *d, int64_t order, uint64_t source, double now) {
    int rank = rd16(d + H_RANK);
    uint16_t slot = rd16(d + H_SLOT), flags = rd16(d + H_FLAGS), count = rd16(d + H_COUNT);
    uint32_t op = rd32(d + H_OP), offset = rd32(d + H_OFFSET);
    int prologue = (flags & F_PROLOGUE) != 0;
    s->delta[C_RX]++;
    if (s->member_keys[rank] != source || slot >= s->slots || count > s->k || (count == 0) != prologue ||
        rd16(d + H_CONTRIBUTORS) > s->world || offset > MAX_OFFSET) {
        s->delta[C_BAD]++;
        return 1;
    }
    if (flags & F_RETRANSMIT)
        s->delta[C_RE]++;
    int64_t row = 2 * (int64_t)slot + (flags & F_VERSION), dest = s->member_dests[rank];
    uint64_t key = ((uint64_t)op << 32) | ((uint64_t)!prologue << 31) | offset; /* protocol.block_key */
    uint64_t bit = (uint64_t)1 << (rank % 64);
    int counted = (s->seen[row * s->words + rank / 64] & bit) != 0;
    if (s->used[row] && key == s->keys[row]) {
        if (s->complete[row]) { /* the result again, to this rank */
            s->delta[counted ? C_DUP : C_OLD]++;
            serve(s, o, order, row_datagram(s, row), dest);
        } else if (counted) {
            s->delta[C_DUP]++;
            if (now - s->started[row] >= STATUS_AFTER_S)
                status(s, o, row, order, dest);
        } else if (count != s->n[row] || (int8_t)d[H_EXPONENT] != s->exponent[row] || d[H_OP_FLAGS] != s->op_flags[row]) {
            s->delta[C_BAD]++;
            return 1;
        } else {
            add(s, row, d, rank, 0);
            maybe_complete(s, o, row, order);
        }
        return 0;
    }
    if (!s->used[row] || key > s->keys[row]) {
        if (s->used[row] && !s->complete[row]) { /* the row's block is still open: not a self-clocked sender */
            s->delta[C_BAD]++;
            return 1;
        }
        keep_queued_result(s, o, row);
        int contributors = rd16(d + H_CONTRIBUTORS);
        s->used[row] = 1, s->keys[row] = key, s->complete[row] = 0, s->count[row] = 0;
        memset(s->seen + row * s->words, 0, 8 * s->words);
        s->min_count[row] = contributors > 0 ? contributors : s->world;
        s->n[row] = count, s->exponent[row] = (int8_t)d[H_EXPONENT], s->op_flags[row] = d[H_OP_FLAGS];
        s->next_exponent[row] = NO_EXPONENT;
        s->started[row] = now, s->deadline[row] = now + s->sto_s, s->expired[row] = 0;
        s->timer_order[row] = s->timers_started++;
        add(s, row, d, rank, 1);
        maybe_complete(s, o, row, order);
        return 0;
    }
    old(s, o, d, key, order, dest);
    return 0;
}

/* ---- the batch ----------------------------------------------------------------------------------------- */
typedef struct {
    PyObject *job;
    JobState *state;
    uint32_t id;
} Current;

static int begin_job(Current *c, PyObject *job) {
    PyObject *state = PyObject_GetAttrString(job, "fast");
    if (state == NULL)
        return -1;
    if (state == Py_None) { /* the job's first packets on this path */
        Py_DECREF(state);
        state = PyObject_CallOneArg((PyObject *)&SwitchJobStateType, job);
        if (state == NULL || PyObject_SetAttrString(job, "fast", state) < 0) {
            Py_XDECREF(state);
            return -1;
        }
    } else if (!PyObject_TypeCheck(state, &SwitchJobStateType)) {
        Py_DECREF(state);
        PyErr_SetString(PyExc_TypeError, "job.fast is not a SwitchJobState");
        return -1;
    }
    JobState *s = (JobState *)state;
    int failed = 0;
    s->timers_started = int_attr(job, "timers_started", &failed);
    s->inserted = int_attr(s->history_object, "inserted", &failed);
    memset(s->delta, 0, sizeof s->delta);
    if (failed) {
        Py_DECREF(state);
        return -1;
    }
    c->job = job;
    c->state = s; /* a new reference, dropped by end_job */
    return 0;
}

static int set_int(PyObject *obj, const char *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    int out = v ? PyObject_SetAttrString(obj, name, v) : -1;
    Py_XDECREF(v);
    return out;
}

/* The job's counters, timers and history position back into its Python object. */
static int end_job(Current *c, double now) {
    JobState *s = c->state;
    if (s == NULL)
        return 0;
    int failed = 0;
    for (int k = 0; k < COUNTERS && !failed; k++) {
        if (!s->delta[k])
            continue;
        PyObject *old = PyDict_GetItemWithError(s->counters, counter_keys[k]);
        long long before = old ? PyLong_AsLongLong(old) : 0;
        PyObject *value = PyLong_FromLongLong(before + s->delta[k]);
        failed = PyErr_Occurred() || value == NULL || PyDict_SetItem(s->counters, counter_keys[k], value) < 0;
        Py_XDECREF(value);
    }
    PyObject *active = PyFloat_FromDouble(now);
    failed = failed || active == NULL || PyObject_SetAttrString(c->job, "last_active", active) < 0 ||
             set_int(c->job, "timers_started", s->timers_started) < 0 ||
             set_int(s->history_object, "inserted", s->inserted) < 0;
    Py_XDECREF(active);
    Py_DECREF(s);
    c->state = NULL;
    c->job = NULL;
    return failed ? -1 : 0;
}

PyObject *fp_switch_batch(PyObject *self, PyObject *args) {
    PyObject *jobs, *buffer_obj, *offsets_obj, *lengths_obj, *sources_obj, *outbox_obj, *scratch_obj, *fill_obj;
    Py_ssize_t start;
    double now;
    if (!PyArg_ParseTuple(args, "O!OOOOndOOO", &PyDict_Type, &jobs, &buffer_obj, &offsets_obj, &lengths_obj,
                          &sources_obj, &start, &now, &outbox_obj, &scratch_obj, &fill_obj))
        return NULL;
    Py_buffer vb, vo, vl, vs, vx, vc, vf;
    int got = 0;
    uint8_t *buffer = array_of(buffer_obj, &vb, 1, 0, 0, 'u');
    got += buffer != NULL;
    int64_t *offsets = buffer ? array_of(offsets_obj, &vo, 8, 0, 0, 'i') : NULL;
    got += offsets != NULL;
    Py_ssize_t n = offsets ? vo.len / 8 : 0;
    int64_t *lengths = offsets ? array_of(lengths_obj, &vl, 8, n, 0, 'i') : NULL;
    got += lengths != NULL;
    uint64_t *sources = lengths ? array_of(sources_obj, &vs, 8, n, 0, 'u') : NULL;
    got += sources != NULL;
    int64_t *entries = sources ? array_of(outbox_obj, &vx, 8, 4, 1, 'i') : NULL;
    got += entries != NULL;
    uint8_t *scratch = entries ? array_of(scratch_obj, &vc, 1, 0, 1, 'u') : NULL;
    got += scratch != NULL;
    int64_t *fill = scratch ? array_of(fill_obj, &vf, 8, 3, 1, 'i') : NULL;
    got += fill != NULL;
    PyObject *out = NULL;
    if (fill == NULL)
        goto done;
    Py_ssize_t capacity = vx.len / 8 / 4;
    Outbox o = {entries, entries + capacity, entries + 2 * capacity, entries + 3 * capacity, fill[0], capacity,
                scratch, fill[1], vc.len, fill[2]};
    Current c = {NULL, NULL, 0};
    long long switch_bad = 0;
    int stop = STOP_END, failed = 0;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < n; i++) {
        const uint8_t *d = buffer + offsets[i];
        if (offsets[i] < 0 || offsets[i] + (lengths[i] > HEADER_BYTES ? lengths[i] : HEADER_BYTES) > vb.len ||
            !header_valid(d, lengths[i])) {
            switch_bad++;
            continue;
        }
        if (d[H_TYPE] != T_DATA) {
            stop = STOP_CONTROL;
            break;
        }
        uint32_t id = rd32(d + H_JOB);
        if (c.state == NULL || id != c.id) {
            if (end_job(&c, now) < 0) {
                failed = 1;
                break;
            }
            PyObject *key = PyLong_FromUnsignedLong(id);
            PyObject *job = key ? PyDict_GetItemWithError(jobs, key) : NULL;
            Py_XDECREF(key);
            if (job == NULL) {
                if (PyErr_Occurred()) {
                    failed = 1;
                    break;
                }
                switch_bad++; /* an unknown job */
                continue;
            }
            if (begin_job(&c, job) < 0) {
                failed = 1;
                break;
            }
            c.id = id;
        }
        JobState *s = c.state;
        if (o.entries + s->world + 1 > o.capacity || o.used + 2 * s->stride + 8 * (s->words + 8) > o.scratch_bytes) {
            if (o.entries == 0 && o.used == 0) {
                PyErr_SetString(PyExc_ValueError, "switch_batch: an outbox too small for one packet's answers");
                failed = 1;
            }
            stop = STOP_FULL;
            break;
        }
        if (rd16(d + H_WORLD) != s->world || rd16(d + H_RANK) >= s->world) {
            s->delta[C_BAD]++; /* a rank that is not part of the job */
            switch_bad++;
            continue;
        }
        switch_bad += contribute(s, &o, d, (int64_t)i, sources[i], now);
    }
    if (end_job(&c, now) < 0)
        failed = 1;
    fill[0] = o.entries;
    fill[1] = o.used;
    if (!failed)
        out = Py_BuildValue("niL", i, stop, switch_bad);
done:
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vl);
    if (got > 3) PyBuffer_Release(&vs);
    if (got > 4) PyBuffer_Release(&vx);
    if (got > 5) PyBuffer_Release(&vc);
    if (got > 6) PyBuffer_Release(&vf);
    return out;
}
