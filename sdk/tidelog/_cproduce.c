/*
 * tidelog._cproduce: the blocking Producer's send() fast lane in C (optional).
 *
 * What it owns: `Lane`, a grant of room in one open producer batch that
 * send() may fill without the accumulator's lock. A lane appends a keyless
 * record with a bytes value (or a null one) to the batch's value and
 * timestamp lists (its create time read here, as time.time_ns() // 1_000_000
 * would), or, a keyed lane, a record with a bytes key to its value, key and
 * timestamp lists (a null value: a tombstone), and, a keyed lane made
 * `keyless` (a batch that keyed and keyless records both reach: the sticky
 * partition's), a keyless record too, its key None in the key list; a lane
 * given the batch's headers list also takes records with headers (a tuple of them in that list,
 * None for a record without), counted as the locked path counts them; and
 * returns the record's FutureRecordMetadata; `keyed_append` does a keyed
 * send() in one call: the key's partition (murmur2), the lane in that slot
 * of the topic's table (a list, one slot per partition, refused when its
 * length is not the partition count send() read), the append; the append that leaves no room for any
 * further record (less than `overhead` bytes) then calls the lane's `on_full`
 * once, so that the accumulator seals the batch and wakes its sender at once
 * rather than when the next record or the linger comes. Nothing else: which
 * batch gets a lane, how much room it is granted (the batch's room and the
 * free buffer memory, reserved by the accumulator) and what happens when the
 * lane is closed or full live in tidelog/_accumulator.py, which runs the same
 * records through its own (locked) append when this module was not compiled. And `plain_body`, the
 * body of such a batch in one pass, for tidelog.records.encode_batch (whose
 * Python path writes the same bytes: tests/unit/sdk/test_accumulator_lanes.py
 * compares them), and `header_blocks`, the header columns of any batch with
 * headers, for the same (tests/unit/sdk/test_header_blocks_c.py). And Kafka's
 * murmur2 and the key's partition (tidelog.partitioner, whose Python twins
 * tests/unit/sdk/test_partitioner.py compares).
 *
 * Why no lock: an append is one C call that does not release the GIL between
 * its check (the lane is open and has room) and its last change to the lists,
 * and `close` runs under the GIL too. keyed_append adds to that check only
 * reads of a list and a hash: the accumulator changes a table's slots and
 * closes their lanes under the GIL as well, so the lane it finds is open or
 * refuses, whatever the order. So every append either lands before the
 * close, and the closer sees it (`used`, the lists' lengths), or is refused
 * after it (None: the caller takes the locked path). Objects are created only
 * where a collection they may start cannot let another thread in between the
 * check and the change: the copy of a record's headers (a tuple, tracked by the
 * garbage collector) is made and checked before the lane is, the timestamp int
 * and the index int are not tracked, and the future (a tuple, which is) is
 * made after the record is in the lists. `on_full` runs after that too, without the
 * accumulator's lock (which it takes itself): by then the lane refuses every
 * other record, and a thread that closed it meanwhile has dealt with its
 * batch, which `on_full` finds out under the lock.
 *
 * Why C: in Python, send() was ~600 ns per record here, ~150 of it the lock,
 * ~130 reading the clock into milliseconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* A header block's u16 fields: a key's UTF-8 bytes and the headers of one
 * record (records.py MAX_HEADER_KEY_BYTES, MAX_HEADERS_PER_RECORD). */
#define HEADER_U16_MAX 0xFFFF

/* The UTF-8 of a header key, or NULL (no error set) when it is not an exact
 * str, cannot be encoded, or is too long for a block. */
static const char *
header_key(PyObject *key, Py_ssize_t *size)
{
    if (!PyUnicode_CheckExact(key)) {
        return NULL;
    }
    const char *utf8 = PyUnicode_AsUTF8AndSize(key, size);
    if (utf8 == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return *size > HEADER_U16_MAX ? NULL : utf8;
}

typedef struct {
    PyObject_HEAD
    PyObject *values;     /* the batch's list of values */
    PyObject *keys;       /* the batch's list of keys (a keyed lane), or NULL */
    PyObject *headers;    /* the batch's list of header lists, or NULL: no headers taken */
    PyObject *timestamps; /* the batch's list of create times (ms) */
    PyObject *result;     /* the batch's BatchResult */
    PyTypeObject *future_type; /* FutureRecordMetadata: a 2-tuple subclass */
    Py_ssize_t room;       /* bytes granted */
    Py_ssize_t used;       /* bytes appended so far */
    Py_ssize_t max_record; /* the largest record the producer takes */
    Py_ssize_t overhead;   /* a record's bytes besides its value: the smallest record */
    PyObject *on_full;     /* called with the lane when it fills, or NULL */
    int keyless;           /* takes records of no key (a keyed lane: a None key in keys) */
    int closed;
} Lane;

static int
lane_init(Lane *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"values", "timestamps", "result", "future_type", "room",
                             "max_record", "overhead", "on_full", "keys", "headers",
                             "keyless", NULL};
    PyObject *values, *timestamps, *result, *future_type, *on_full = Py_None, *keys = Py_None;
    PyObject *headers = Py_None;
    Py_ssize_t room, max_record, overhead;
    PyObject *keyless_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OO!nnn|OOOO", kwlist, &PyList_Type, &values,
                                     &PyList_Type, &timestamps, &result, &PyType_Type,
                                     &future_type, &room, &max_record, &overhead, &on_full,
                                     &keys, &headers, &keyless_arg)) {
        return -1;
    }
    int keyless = keyless_arg == Py_None ? -1 : PyObject_IsTrue(keyless_arg);
    if (keyless_arg != Py_None && keyless < 0) {
        return -1;
    }
    /* A lane without the keys list takes keyless records only; one with it,
     * keyed ones, and keyless ones too (a None key) when told so. */
    if (keyless == -1) {
        keyless = keys == Py_None;
    } else if (!keyless && keys == Py_None) {
        PyErr_SetString(PyExc_ValueError, "a lane without keys takes keyless records");
        return -1;
    }
    if ((keys != Py_None && !PyList_CheckExact(keys)) ||
        (headers != Py_None && !PyList_CheckExact(headers))) {
        PyErr_SetString(PyExc_TypeError, "keys and headers must each be a list or None");
        return -1;
    }
    /* The columns of a lane grow together: they must start equal. */
    if ((keys != Py_None && PyList_GET_SIZE(keys) != PyList_GET_SIZE(values)) ||
        (headers != Py_None && PyList_GET_SIZE(headers) != PyList_GET_SIZE(values))) {
        PyErr_SetString(PyExc_ValueError,
                        "keys, headers and values must be as long as each other");
        return -1;
    }
    if (on_full != Py_None && !PyCallable_Check(on_full)) {
        PyErr_SetString(PyExc_TypeError, "on_full must be callable or None");
        return -1;
    }
    PyTypeObject *ft = (PyTypeObject *)future_type;
    /* Built as tuple_subtype_new builds it: only for a tuple subclass without a
     * __dict__ (FutureRecordMetadata has __slots__ = ()). */
    if (!PyType_IsSubtype(ft, &PyTuple_Type) || ft->tp_dictoffset != 0 ||
        ft->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "future_type must be a tuple subclass with __slots__ = ()");
        return -1;
    }
    if (room < 0 || max_record < 0 || overhead < 0) {
        PyErr_SetString(PyExc_ValueError, "room, max_record and overhead must be >= 0");
        return -1;
    }
    Py_INCREF(values);
    Py_XSETREF(self->values, values);
    Py_INCREF(timestamps);
    Py_XSETREF(self->timestamps, timestamps);
    if (keys == Py_None) {
        Py_CLEAR(self->keys);
    } else {
        Py_INCREF(keys);
        Py_XSETREF(self->keys, keys);
    }
    if (headers == Py_None) {
        Py_CLEAR(self->headers);
    } else {
        Py_INCREF(headers);
        Py_XSETREF(self->headers, headers);
    }
    Py_INCREF(result);
    Py_XSETREF(self->result, result);
    Py_INCREF(future_type);
    Py_XSETREF(self->future_type, ft);
    if (on_full == Py_None) {
        Py_CLEAR(self->on_full);
    } else {
        Py_INCREF(on_full);
        Py_XSETREF(self->on_full, on_full);
    }
    self->room = room;
    self->used = 0;
    self->max_record = max_record;
    self->overhead = overhead;
    self->keyless = keyless;
    self->closed = 0;
    return 0;
}

static int
lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->values);
    Py_VISIT(self->keys);
    Py_VISIT(self->headers);
    Py_VISIT(self->timestamps);
    Py_VISIT(self->result);
    Py_VISIT(self->future_type);
    Py_VISIT(self->on_full);
    return 0;
}

static int
lane_clear(Lane *self)
{
    Py_CLEAR(self->values);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->timestamps);
    Py_CLEAR(self->result);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->on_full);
    return 0;
}

static void
lane_dealloc(Lane *self)
{
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(lane_append_doc,
"append(value, headers=None) -> FutureRecordMetadata | None\n\n"
"Add one record with this value (bytes, or None: a null value), no key and\n"
"these headers (None or empty: none; else a list or tuple of (str, bytes |\n"
"None) tuples, stored as a tuple as send() stores them), created now, to the\n"
"batch (a keyed lane made with keyless=True: a None key in its keys list);\n"
"None when the lane is closed or does not take keyless records, the value is\n"
"not exactly bytes or None, the headers are not exactly of those types or do not fit a header\n"
"block, the record has headers and the lane no headers column, or the record\n"
"does not fit the room left or max_record (the caller's locked path decides\n"
"then).\n"
"When the record leaves less room than `overhead` (no further record fits),\n"
"on_full(lane) is called before returning; what it raises is reported as\n"
"unraisable, since the record is in and its future is owed.");

PyDoc_STRVAR(lane_append_keyed_doc,
"append_keyed(key, value, headers=None) -> FutureRecordMetadata | None\n\n"
"append() for a keyed lane: one record with this bytes key (a None value: a\n"
"tombstone); None when the lane is not keyed or as append() refuses. The\n"
"record counts `overhead` + len(key) + len(value) bytes, and its headers'.");

/* The bytes a record's headers add to it, as tidelog._accumulator.record_size
 * counts them (not as a header block is written): 4 for the headers, 8 per
 * header besides its key's UTF-8 and its value. The batches a lane fills must
 * end where the locked path's end, record for record. */
#define RECORD_HEADERS_SIZE 4
#define RECORD_HEADER_SIZE 8

/* A record's headers as a lane takes them: *copy a tuple of the headers
 * (NULL: the record has none: None, or an empty list or tuple) and *size the
 * bytes they add to the record. 1 then; 0 (nothing owned) when the lane must
 * refuse them: not an exact list or tuple of exact (str, bytes | None)
 * tuples, or what the locked path refuses with an error (over 65,535 headers,
 * a key over 65,535 UTF-8 bytes or not encodable); -1 with an error set.
 *
 * A tuple, as the locked path stores tuple(headers): a list the caller passed
 * may change after send() returns, so it is copied (and checked in the copy,
 * which is ours); a tuple of such tuples cannot change, so it is kept as it
 * is, as tuple() keeps it. And a tuple rather than a list because the garbage
 * collector stops tracking a tuple of untracked objects (str, bytes, such
 * tuples) at its first collection: a list per record would stay tracked while
 * its batch waits, and every collection would walk them all (a lane took a
 * record with one header in ~0.6-1.1 us so, ~0.3 with a tuple copy of a list,
 * ~0.2 with the caller's tuple). The copy is made before the lane's checks:
 * a new tuple is tracked, and the collection it may start could let another
 * thread in, which must come before those checks, not between them and the
 * appends. */
static int
lane_headers(PyObject *headers, PyObject **copy, Py_ssize_t *size)
{
    *copy = NULL;
    *size = 0;
    if (headers == NULL || headers == Py_None) {
        return 1;
    }
    PyObject *tuple;
    if (PyTuple_CheckExact(headers)) {
        if (PyTuple_GET_SIZE(headers) == 0) {
            return 1;
        }
        tuple = Py_NewRef(headers);
    } else if (PyList_CheckExact(headers)) {
        Py_ssize_t n = PyList_GET_SIZE(headers);
        if (n == 0) {
            return 1;
        }
        tuple = PyTuple_New(n);
        if (tuple == NULL) {
            return -1;
        }
        /* Made before the list's items are read: a collection it started
         * that let another thread change the list is seen here. */
        if (PyList_GET_SIZE(headers) != n) {
            Py_DECREF(tuple);
            return 0;
        }
        for (Py_ssize_t h = 0; h < n; h++) {
            PyTuple_SET_ITEM(tuple, h, Py_NewRef(PyList_GET_ITEM(headers, h)));
        }
    } else {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > HEADER_U16_MAX) {
        Py_DECREF(tuple);
        return 0;
    }
    Py_ssize_t total = RECORD_HEADERS_SIZE;
    for (Py_ssize_t h = 0; h < n; h++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, h);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(tuple);
            return 0;
        }
        PyObject *value = PyTuple_GET_ITEM(item, 1);
        Py_ssize_t klen;
        if (header_key(PyTuple_GET_ITEM(item, 0), &klen) == NULL ||
            (value != Py_None && !PyBytes_CheckExact(value))) {
            Py_DECREF(tuple);
            return 0;
        }
        Py_ssize_t vlen = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        /* Far above any max_record: refused, and no sum can overflow. */
        if (vlen > INT32_MAX || total > INT32_MAX) {
            Py_DECREF(tuple);
            return 0;
        }
        total += RECORD_HEADER_SIZE + klen + vlen;
    }
    *copy = tuple;
    *size = total;
    return 1;
}

/* Take `list` back to its first `length` items (undoing this append). */
static void
truncate_list(PyObject *list, Py_ssize_t length)
{
    if (list != NULL && PyList_GET_SIZE(list) > length) {
        PyList_SetSlice(list, length, PyList_GET_SIZE(list), NULL);
    }
}

/* Add the record (key NULL: keyless; headers NULL or None: none) or return
 * None (see lane_append_doc). Nothing between the first check of the lane and
 * the last list change can run Python code or let another thread in (see the
 * module comment). */
static PyObject *
lane_put(Lane *self, PyObject *key, PyObject *value, PyObject *headers)
{
    PyObject *copy = NULL;
    Py_ssize_t size = 0;
    /* Most records have no headers: they pay one comparison for them. */
    if (headers != NULL && headers != Py_None) {
        int taken = lane_headers(headers, &copy, &size);
        if (taken <= 0) {
            if (taken < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    /* From here until the record is in, no object the garbage collector
     * tracks is made. Dropping `copy` when refusing runs no Python code: the
     * caller's headers still hold its items. */
    if (self->closed || self->values == NULL || (value != Py_None && !PyBytes_CheckExact(value)) ||
        (key == NULL ? !self->keyless : self->keys == NULL) ||
        (copy != NULL && self->headers == NULL)) {
        Py_XDECREF(copy);
        Py_RETURN_NONE;
    }
    size += self->overhead + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
    if (key != NULL) {
        if (!PyBytes_CheckExact(key)) {
            Py_XDECREF(copy);
            Py_RETURN_NONE;
        }
        size += PyBytes_GET_SIZE(key);
    }
    if (size > self->max_record || self->used + size > self->room) {
        Py_XDECREF(copy);
        Py_RETURN_NONE;
    }
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        Py_XDECREF(copy);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    PyObject *timestamp = PyLong_FromLongLong(ms);
    if (timestamp == NULL) {
        Py_XDECREF(copy);
        return NULL;
    }
    Py_ssize_t index = PyList_GET_SIZE(self->values);
    PyObject *position = PyLong_FromSsize_t(index);
    if (position == NULL) {
        Py_DECREF(timestamp);
        Py_XDECREF(copy);
        return NULL;
    }
    /* The lists grow together or not at all (a failed later append takes
     * the earlier ones back), so the batch's columns always agree. */
    if (PyList_Append(self->values, value) < 0 ||
        (self->keys != NULL && PyList_Append(self->keys, key != NULL ? key : Py_None) < 0) ||
        (self->headers != NULL && PyList_Append(self->headers, copy ? copy : Py_None) < 0) ||
        PyList_Append(self->timestamps, timestamp) < 0) {
        truncate_list(self->values, index);
        truncate_list(self->keys, index);
        truncate_list(self->headers, index);
        Py_DECREF(timestamp);
        Py_DECREF(position);
        Py_XDECREF(copy);
        return NULL;
    }
    Py_DECREF(timestamp);
    Py_XDECREF(copy);
    self->used += size;
    /* The record is in: from here a collection letting another thread in is
     * harmless. Whether it filled the lane is decided before that: one
     * comparison is all a record that did not costs. The reference taken
     * keeps on_full alive while it runs, though the lane be closed (close
     * drops the lane's own). */
    PyObject *on_full = NULL;
    if (self->room - self->used < self->overhead && self->on_full != NULL) {
        on_full = Py_NewRef(self->on_full);
    }
    PyObject *future = self->future_type->tp_alloc(self->future_type, 2);
    if (future == NULL) {
        Py_DECREF(position);
        Py_XDECREF(on_full);
        return NULL;
    }
    Py_INCREF(self->result);
    PyTuple_SET_ITEM(future, 0, self->result);
    PyTuple_SET_ITEM(future, 1, position);
    if (on_full != NULL) {
        PyObject *done = PyObject_CallOneArg(on_full, (PyObject *)self);
        Py_DECREF(on_full);
        if (done == NULL) {
            /* The batch then waits for its linger or the next record, as it
             * did before on_full; the record must not look failed. */
            PyErr_WriteUnraisable((PyObject *)self);
        }
        Py_XDECREF(done);
    }
    return future;
}

static PyObject *
lane_append(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "append(value, headers=None)");
        return NULL;
    }
    return lane_put(self, NULL, args[0], nargs == 2 ? args[1] : NULL);
}

static PyObject *
lane_append_keyed(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "append_keyed(key, value, headers=None)");
        return NULL;
    }
    if (args[0] == Py_None) {
        Py_RETURN_NONE;
    }
    return lane_put(self, args[0], args[1], nargs == 3 ? args[2] : NULL);
}

PyDoc_STRVAR(lane_close_doc,
"close() -> int\n\n"
"Refuse every later append (and drop on_full); return the bytes appended (0 if\n"
"already closed).");

static PyObject *
lane_close(Lane *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed) {
        return PyLong_FromLong(0);
    }
    self->closed = 1;
    /* A closed lane never fills: drop the reference (the accumulator's
     * on_full refers to the batch, which refers to the lane). */
    Py_CLEAR(self->on_full);
    return PyLong_FromSsize_t(self->used);
}

static PyObject *
lane_get_used(Lane *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->used);
}

static PyObject *
lane_get_room(Lane *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->room);
}

static PyObject *
lane_get_closed(Lane *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed);
}

static PyObject *
lane_get_keyed(Lane *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->keys != NULL);
}

static PyObject *
lane_get_keyless(Lane *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->keyless);
}

static PyObject *
lane_get_with_headers(Lane *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->headers != NULL);
}

static PyMethodDef lane_methods[] = {
    {"append", (PyCFunction)(void (*)(void))lane_append, METH_FASTCALL, lane_append_doc},
    {"append_keyed", (PyCFunction)(void (*)(void))lane_append_keyed, METH_FASTCALL,
     lane_append_keyed_doc},
    {"close", (PyCFunction)lane_close, METH_NOARGS, lane_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lane_getset[] = {
    {"used", (getter)lane_get_used, NULL, "bytes appended so far", NULL},
    {"room", (getter)lane_get_room, NULL, "bytes granted", NULL},
    {"closed", (getter)lane_get_closed, NULL, "whether close() was called", NULL},
    {"keyed", (getter)lane_get_keyed, NULL, "whether the lane takes keyed records", NULL},
    {"keyless", (getter)lane_get_keyless, NULL,
     "whether the lane takes records of no key (append)", NULL},
    {"with_headers", (getter)lane_get_with_headers, NULL,
     "whether the lane takes records with headers (it has the batch's headers list)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(lane_doc,
"Lane(values, timestamps, result, future_type, room, max_record, overhead,\n"
"     on_full=None, keys=None, headers=None, keyless=None)\n\n"
"A grant of `room` bytes in one open batch (its `values` and `timestamps`\n"
"lists and its BatchResult) for records each counted `overhead` + len(value)\n"
"bytes: records of no key (append) or, given the batch's `keys` list, records\n"
"with a bytes key (append_keyed, keyed_append), which also count len(key),\n"
"and, when `keyless` is true, records of no key as well (a None key in\n"
"`keys`: the lane of a batch both kinds reach). `keyless` defaults to\n"
"whether `keys` is None; a lane without `keys` takes only keyless records.\n"
"Given the batch's `headers` list, records with headers too (each record's\n"
"a tuple, or None for none), which also count their headers as\n"
"tidelog._accumulator.record_size does; without it, only records without.\n"
"on_full(lane) is called by the append that leaves less than `overhead`\n"
"bytes of room; see tidelog._accumulator.");

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidelog._cproduce.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = lane_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)lane_init,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_methods = lane_methods,
    .tp_getset = lane_getset,
};

PyDoc_STRVAR(plain_body_doc,
"plain_body(values, timestamps) -> bytes | None\n\n"
"The uncompressed body of a batch of records with no key and no headers, as\n"
"tidelog.records.encode_batch writes it: the flags byte, the timestamps column\n"
"(when `timestamps` is a list, else none), a key length of -1 per record, the\n"
"value lengths and the values. None when a value is not exactly bytes (the\n"
"caller's Python path then handles it, nulls included). Little-endian columns,\n"
"as records.py writes them on every machine.");

static void
put_le32(char *p, uint32_t v)
{
    p[0] = (char)(v & 0xff);
    p[1] = (char)((v >> 8) & 0xff);
    p[2] = (char)((v >> 16) & 0xff);
    p[3] = (char)((v >> 24) & 0xff);
}

static PyObject *
plain_body(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) ||
        (args[1] != Py_None && !PyList_CheckExact(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "plain_body(values: list, timestamps: list | None)");
        return NULL;
    }
    PyObject *values = args[0];
    PyObject *timestamps = args[1] == Py_None ? NULL : args[1];
    Py_ssize_t count = PyList_GET_SIZE(values);
    if (timestamps != NULL && PyList_GET_SIZE(timestamps) != count) {
        PyErr_SetString(PyExc_ValueError, "plain_body: one timestamp per value");
        return NULL;
    }
    Py_ssize_t blob = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(v)) {
            Py_RETURN_NONE;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if (n > INT32_MAX || blob > PY_SSIZE_T_MAX - n) {
            PyErr_SetString(PyExc_OverflowError, "plain_body: values too large");
            return NULL;
        }
        blob += n;
    }
    Py_ssize_t ts_bytes = timestamps == NULL ? 0 : 8 * count;
    Py_ssize_t total = 1 + ts_bytes + 8 * count + blob;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        return NULL;
    }
    char *p = PyBytes_AS_STRING(out);
    *p++ = (char)(timestamps == NULL ? 0 : 0x02); /* records.py's _FLAG_TIMESTAMPS */
    for (Py_ssize_t i = 0; i < (timestamps == NULL ? 0 : count); i++) {
        long long t = PyLong_AsLongLong(PyList_GET_ITEM(timestamps, i));
        if (t == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        uint64_t u = (uint64_t)t;
        put_le32(p, (uint32_t)(u & 0xffffffffu));
        put_le32(p + 4, (uint32_t)(u >> 32));
        p += 8;
    }
    memset(p, 0xff, 4 * (size_t)count); /* every key null: length -1 */
    p += 4 * count;
    for (Py_ssize_t i = 0; i < count; i++) {
        put_le32(p, (uint32_t)PyBytes_GET_SIZE(PyList_GET_ITEM(values, i)));
        p += 4;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        memcpy(p, PyBytes_AS_STRING(v), (size_t)n);
        p += n;
    }
    return out;
}

PyDoc_STRVAR(header_blocks_doc,
"header_blocks(headers) -> (lengths, blocks) | None\n\n"
"The header columns of a batch body as tidelog.records writes them: one\n"
"little-endian int32 block length per record (0 for None or no headers) and\n"
"the blocks concatenated, each a u16 count, then per header a u16 key length,\n"
"the key in UTF-8, an i32 value length (-1 for None) and the value. `headers`\n"
"is a list with, per record, None or a list or tuple of (str, bytes | None)\n"
"tuples. None when anything is not exactly of those types or does not fit a\n"
"block (a key over 65,535 UTF-8 bytes, over 65,535 headers): the caller's\n"
"Python path then handles it, with its own errors. In Python the blocks cost\n"
"~1 us per record with one header, on the producer's event loop.");

/* Bytes of one record's header block, or -1 when the caller's Python path
 * must take the batch (see header_blocks_doc). */
static Py_ssize_t
header_block_size(PyObject *record)
{
    if (record == Py_None) {
        return 0;
    }
    if (!PyList_CheckExact(record) && !PyTuple_CheckExact(record)) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(record);
    if (n == 0) {
        return 0;
    }
    if (n > HEADER_U16_MAX) {
        return -1;
    }
    Py_ssize_t size = 2;
    PyObject **items = PySequence_Fast_ITEMS(record);
    for (Py_ssize_t h = 0; h < n; h++) {
        PyObject *item = items[h];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
            return -1;
        }
        PyObject *value = PyTuple_GET_ITEM(item, 1);
        Py_ssize_t klen;
        if (header_key(PyTuple_GET_ITEM(item, 0), &klen) == NULL ||
            (value != Py_None && !PyBytes_CheckExact(value))) {
            return -1;
        }
        size += 6 + klen + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
        if (size > INT32_MAX) {
            return -1;
        }
    }
    return size;
}

static PyObject *
header_blocks(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyList_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "header_blocks(headers: list)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(arg);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = header_block_size(PyList_GET_ITEM(arg, i));
        if (size < 0 || total > PY_SSIZE_T_MAX - size) {
            Py_RETURN_NONE;
        }
        total += size;
    }
    PyObject *lengths = PyBytes_FromStringAndSize(NULL, 4 * count);
    PyObject *blocks = PyBytes_FromStringAndSize(NULL, total);
    if (lengths == NULL || blocks == NULL) {
        Py_XDECREF(lengths);
        Py_XDECREF(blocks);
        return NULL;
    }
    char *lp = PyBytes_AS_STRING(lengths);
    char *bp = PyBytes_AS_STRING(blocks);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = PyList_GET_ITEM(arg, i);
        char *start = bp;
        Py_ssize_t n = record == Py_None ? 0 : PySequence_Fast_GET_SIZE(record);
        if (n > 0) {
            bp[0] = (char)(n & 0xff);
            bp[1] = (char)((n >> 8) & 0xff);
            bp += 2;
            PyObject **items = PySequence_Fast_ITEMS(record);
            for (Py_ssize_t h = 0; h < n; h++) {
                Py_ssize_t klen;
                /* Checked by header_block_size: cannot fail here (cached UTF-8). */
                const char *key = header_key(PyTuple_GET_ITEM(items[h], 0), &klen);
                PyObject *value = PyTuple_GET_ITEM(items[h], 1);
                bp[0] = (char)(klen & 0xff);
                bp[1] = (char)((klen >> 8) & 0xff);
                memcpy(bp + 2, key, (size_t)klen);
                bp += 2 + klen;
                if (value == Py_None) {
                    put_le32(bp, 0xffffffffu);
                    bp += 4;
                }
                else {
                    Py_ssize_t vlen = PyBytes_GET_SIZE(value);
                    put_le32(bp, (uint32_t)vlen);
                    memcpy(bp + 4, PyBytes_AS_STRING(value), (size_t)vlen);
                    bp += 4 + vlen;
                }
            }
        }
        put_le32(lp, (uint32_t)(bp - start));
        lp += 4;
    }
    return Py_BuildValue("(NN)", lengths, blocks);
}

PyDoc_STRVAR(murmur2_doc,
"murmur2(data) -> int\n\n"
"Kafka's murmur2 of a bytes-like `data` (Utils.murmur2), a signed 32-bit int:\n"
"tidelog.partitioner.murmur2, whose Python twin took ~1.4 us for an 8-byte\n"
"key and ~10 us for a 100-byte one.");

PyDoc_STRVAR(partition_for_key_doc,
"partition_for_key(key, partition_count) -> int\n\n"
"toPositive(murmur2(key)) % partition_count, the partition Kafka's default\n"
"partitioner picks (tidelog.partitioner.partition_for_key). ValueError for a\n"
"count outside 1..2147483647, as the Python twin.");

static uint32_t
kafka_murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t tail = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < tail; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
                     ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* murmur2 of a bytes-like object; 0 and an error set when it is not one. */
static int
murmur2_of(PyObject *data, uint32_t *out)
{
    if (PyBytes_CheckExact(data)) {
        *out = kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(data),
                             PyBytes_GET_SIZE(data));
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    *out = kafka_murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *
murmur2(PyObject *Py_UNUSED(module), PyObject *data)
{
    uint32_t h;
    if (murmur2_of(data, &h) < 0) {
        return NULL;
    }
    return PyLong_FromLong((long)(int32_t)h);
}

static PyObject *
partition_for_key(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for_key(key, partition_count)");
        return NULL;
    }
    int overflow;
    long long count = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || count < 1 || count > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a partition count is 1..2147483647");
        return NULL;
    }
    uint32_t h;
    if (murmur2_of(args[0], &h) < 0) {
        return NULL;
    }
    return PyLong_FromLong((long)((h & 0x7fffffffu) % (uint32_t)count));
}

PyDoc_STRVAR(keyed_append_doc,
"keyed_append(table, partition_count, key, value, headers=None)\n"
"    -> FutureRecordMetadata | None\n\n"
"send() of a bytes key and a bytes value (or None: a tombstone) in one call:\n"
"the key's partition p (partition_for_key(key, partition_count)), then\n"
"table[p].append_keyed(key, value, headers). `table` is a topic's list of\n"
"keyed lanes, one slot per partition\n"
"(None: no lane). None, for the caller's locked path, when the table's\n"
"length is not `partition_count` (it was made for another count: the\n"
"metadata changed), `partition_count` is not an int, the key is not exactly\n"
"bytes, the slot holds no lane, or the lane refuses.");

static PyObject *
keyed_append(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "keyed_append(table, partition_count, key, value, headers=None)");
        return NULL;
    }
    PyObject *table = args[0];
    PyObject *key = args[2];
    if (!PyList_CheckExact(table) || !PyLong_CheckExact(args[1]) || !PyBytes_CheckExact(key)) {
        Py_RETURN_NONE;
    }
    int overflow;
    long long count = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || count < 1 || count != (long long)PyList_GET_SIZE(table)) {
        Py_RETURN_NONE;
    }
    uint32_t h = kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(key),
                               PyBytes_GET_SIZE(key));
    PyObject *lane = PyList_GET_ITEM(table, (Py_ssize_t)((h & 0x7fffffffu) % (uint32_t)count));
    if (Py_TYPE(lane) != &LaneType) {
        Py_RETURN_NONE;
    }
    /* The table's slot may be emptied by on_full, which the append may call:
     * hold the lane while it runs. */
    Py_INCREF(lane);
    PyObject *future = lane_put((Lane *)lane, key, args[3], nargs == 5 ? args[4] : NULL);
    Py_DECREF(lane);
    return future;
}

static PyMethodDef cproduce_methods[] = {
    {"plain_body", (PyCFunction)(void (*)(void))plain_body, METH_FASTCALL, plain_body_doc},
    {"header_blocks", (PyCFunction)header_blocks, METH_O, header_blocks_doc},
    {"murmur2", (PyCFunction)murmur2, METH_O, murmur2_doc},
    {"partition_for_key", (PyCFunction)(void (*)(void))partition_for_key, METH_FASTCALL,
     partition_for_key_doc},
    {"keyed_append", (PyCFunction)(void (*)(void))keyed_append, METH_FASTCALL, keyed_append_doc},
    {NULL, NULL, 0, NULL},
};

static int
cproduce_exec(PyObject *module)
{
    if (PyType_Ready(&LaneType) < 0) {
        return -1;
    }
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot cproduce_slots[] = {
    {Py_mod_exec, cproduce_exec},
    {0, NULL},
};

static struct PyModuleDef cproduce_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog._cproduce",
    .m_doc = "The blocking Producer's send() fast lane in C; see tidelog._accumulator.",
    .m_size = 0,
    .m_methods = cproduce_methods,
    .m_slots = cproduce_slots,
};

PyMODINIT_FUNC
PyInit__cproduce(void)
{
    return PyModuleDef_Init(&cproduce_module);
}
