/* A switch job's state for the C fast path: `SwitchJobState(job)` holds views of the arrays of a
 * `switch.job.SwitchJob` (it keeps no reference to the job itself), made on the job's first packets on this path;
 * begin_job / end_job carry the Python-side scalars (timers started, history position, counters, last activity)
 * in and out around a batch. */
#include "switch.h"

static const char *counter_names[COUNTERS] = {"ok", "to", "kr", "re", "dup", "old", "bad", "sy", "rx", "tx"};
static PyObject *counter_keys[COUNTERS];

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

int switch_state_init(void) {
    for (int c = 0; c < COUNTERS; c++)
        if ((counter_keys[c] = PyUnicode_InternFromString(counter_names[c])) == NULL)
            return -1;
    return 0;
}

int begin_job(Current *c, PyObject *job) {
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
int end_job(Current *c, double now) {
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
