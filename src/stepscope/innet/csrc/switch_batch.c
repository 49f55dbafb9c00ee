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

#include "switch.h"

#include <math.h>

#define STATUS_AFTER_S 0.1 /* switch/job.py: a duplicate of a block open this long gets a STATUS */

/* ---- the outbox ---------------------------------------------------------------------------------------- */
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

int outbox_open(Outbox *o, PyObject *entries_obj, PyObject *scratch_obj, PyObject *fill_obj) {
    int64_t *entries = array_of(entries_obj, &o->views[0], 8, 4, 1, 'i');
    if (entries == NULL)
        return -1;
    o->scratch = array_of(scratch_obj, &o->views[1], 1, 0, 1, 'u');
    o->fill = o->scratch ? array_of(fill_obj, &o->views[2], 8, 3, 1, 'i') : NULL;
    if (o->fill == NULL) {
        PyBuffer_Release(&o->views[0]);
        if (o->scratch)
            PyBuffer_Release(&o->views[1]);
        return -1;
    }
    o->capacity = o->views[0].len / 8 / 4;
    o->order = entries, o->pointer = entries + o->capacity, o->length = entries + 2 * o->capacity;
    o->dest = entries + 3 * o->capacity;
    o->entries = o->fill[0], o->used = o->fill[1], o->generation = o->fill[2];
    o->scratch_bytes = o->views[1].len;
    return 0;
}

void outbox_close(Outbox *o) {
    o->fill[0] = o->entries, o->fill[1] = o->used, o->fill[2] = o->generation;
    for (int i = 0; i < 3; i++)
        PyBuffer_Release(&o->views[i]);
}

Py_ssize_t run_batch(PyObject *jobs, const uint8_t *buffer, Py_ssize_t buffer_bytes, const int64_t *offsets,
                     const int64_t *lengths, const uint64_t *sources, Py_ssize_t n, Py_ssize_t start, double now,
                     Outbox *o, int *stop, long long *switch_bad) {
    Current c = {NULL, NULL, 0};
    int failed = 0;
    *stop = STOP_END;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < n; i++) {
        const uint8_t *d = buffer + offsets[i];
        if (offsets[i] < 0 || offsets[i] + (lengths[i] > HEADER_BYTES ? lengths[i] : HEADER_BYTES) > buffer_bytes ||
            !header_valid(d, lengths[i])) {
            (*switch_bad)++;
            continue;
        }
        if (d[H_TYPE] != T_DATA) {
            *stop = STOP_CONTROL;
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
                (*switch_bad)++; /* an unknown job */
                continue;
            }
            if (begin_job(&c, job) < 0) {
                failed = 1;
                break;
            }
            c.id = id;
        }
        JobState *s = c.state;
        if (o->entries + s->world + 1 > o->capacity || o->used + 2 * s->stride + 8 * (s->words + 8) > o->scratch_bytes) {
            if (o->entries == 0 && o->used == 0) {
                PyErr_SetString(PyExc_ValueError, "switch_batch: an outbox too small for one packet's answers");
                failed = 1;
            }
            *stop = STOP_FULL;
            break;
        }
        if (rd16(d + H_WORLD) != s->world || rd16(d + H_RANK) >= s->world) {
            s->delta[C_BAD]++; /* a rank that is not part of the job */
            (*switch_bad)++;
            continue;
        }
        *switch_bad += contribute(s, o, d, (int64_t)i, sources[i], now);
    }
    if (end_job(&c, now) < 0)
        failed = 1;
    return failed ? -1 : i;
}

PyObject *fp_switch_batch(PyObject *self, PyObject *args) {
    PyObject *jobs, *buffer_obj, *offsets_obj, *lengths_obj, *sources_obj, *outbox_obj, *scratch_obj, *fill_obj;
    Py_ssize_t start;
    double now;
    if (!PyArg_ParseTuple(args, "O!OOOOndOOO", &PyDict_Type, &jobs, &buffer_obj, &offsets_obj, &lengths_obj,
                          &sources_obj, &start, &now, &outbox_obj, &scratch_obj, &fill_obj))
        return NULL;
    Py_buffer vb, vo, vl, vs;
    Outbox o;
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
    got += sources != NULL && outbox_open(&o, outbox_obj, scratch_obj, fill_obj) == 0;
    PyObject *out = NULL;
    if (got == 5) {
        int stop;
        long long switch_bad = 0;
        Py_ssize_t next = run_batch(jobs, buffer, vb.len, offsets, lengths, sources, n, start, now, &o, &stop,
                                    &switch_bad);
        outbox_close(&o);
        if (next >= 0)
            out = Py_BuildValue("niL", next, stop, switch_bad);
    }
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vl);
    if (got > 3) PyBuffer_Release(&vs);
    return out;
}
