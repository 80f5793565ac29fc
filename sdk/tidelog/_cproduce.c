/*
 * tidelog._cproduce: the blocking Producer's send() fast lane in C (optional).
 *
 * What it owns: `Lane`, a grant of room in one open producer batch that
 * send() may fill without the accumulator's lock. A lane appends a keyless,
 * header-less bytes record to the batch's value and timestamp lists (its
 * create time read here, as time.time_ns() // 1_000_000 would) and returns
 * the record's FutureRecordMetadata. Nothing else: which batch gets a lane,
 * how much room it is granted (the batch's room and the free buffer memory,
 * reserved by the accumulator) and what happens when the lane is closed live
 * in tidelog/_accumulator.py, which runs the same records through its own
 * (locked) append when this module was not compiled.
 *
 * Why no lock: an append is one C call that does not release the GIL between
 * its check (the lane is open and has room) and its last change to the lists,
 * and `close` runs under the GIL too. So every append either lands before the
 * close, and the closer sees it (`used`, the lists' lengths), or is refused
 * after it (None: the caller takes the locked path). Objects are created only
 * where a collection they may start cannot let another thread in between the
 * check and the change: the timestamp int and the index int are not tracked
 * by the garbage collector, and the future (a tuple, which is) is made after
 * the record is in the lists.
 *
 * Why C: in Python, send() was ~600 ns per record here, ~150 of it the lock,
 * ~130 reading the clock into milliseconds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *values;     /* the batch's list of values */
    PyObject *timestamps; /* the batch's list of create times (ms) */
    PyObject *result;     /* the batch's BatchResult */
    PyTypeObject *future_type; /* FutureRecordMetadata: a 2-tuple subclass */
    Py_ssize_t room;       /* bytes granted */
    Py_ssize_t used;       /* bytes appended so far */
    Py_ssize_t max_record; /* the largest record the producer takes */
    Py_ssize_t overhead;   /* a record's bytes besides its value */
    int closed;
} Lane;

static int
lane_init(Lane *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"values", "timestamps", "result", "future_type", "room",
                             "max_record", "overhead", NULL};
    PyObject *values, *timestamps, *result, *future_type;
    Py_ssize_t room, max_record, overhead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OO!nnn", kwlist, &PyList_Type, &values,
                                     &PyList_Type, &timestamps, &result, &PyType_Type,
                                     &future_type, &room, &max_record, &overhead)) {
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
    Py_INCREF(result);
    Py_XSETREF(self->result, result);
    Py_INCREF(future_type);
    Py_XSETREF(self->future_type, ft);
    self->room = room;
    self->used = 0;
    self->max_record = max_record;
    self->overhead = overhead;
    self->closed = 0;
    return 0;
}

static int
lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->values);
    Py_VISIT(self->timestamps);
    Py_VISIT(self->result);
    Py_VISIT(self->future_type);
    return 0;
}

static int
lane_clear(Lane *self)
{
    Py_CLEAR(self->values);
    Py_CLEAR(self->timestamps);
    Py_CLEAR(self->result);
    Py_CLEAR(self->future_type);
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
"append(value) -> FutureRecordMetadata | None\n\n"
"Add one record with this bytes value (no key, no headers, created now) to the\n"
"batch; None when the lane is closed, the value is not exactly bytes, or the\n"
"record does not fit the room left or max_record (the caller's locked path\n"
"decides then).");

static PyObject *
lane_append(Lane *self, PyObject *value)
{
    if (self->closed || self->values == NULL || !PyBytes_CheckExact(value)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t size = self->overhead + PyBytes_GET_SIZE(value);
    if (size > self->max_record || self->used + size > self->room) {
        Py_RETURN_NONE;
    }
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    PyObject *timestamp = PyLong_FromLongLong(ms);
    if (timestamp == NULL) {
        return NULL;
    }
    Py_ssize_t index = PyList_GET_SIZE(self->values);
    PyObject *position = PyLong_FromSsize_t(index);
    if (position == NULL) {
        Py_DECREF(timestamp);
        return NULL;
    }
    /* Both lists grow together or not at all (a failed second append takes
     * the first back), so the batch's columns always agree. */
    if (PyList_Append(self->values, value) < 0) {
        Py_DECREF(timestamp);
        Py_DECREF(position);
        return NULL;
    }
    if (PyList_Append(self->timestamps, timestamp) < 0) {
        PyList_SetSlice(self->values, index, index + 1, NULL);
        Py_DECREF(timestamp);
        Py_DECREF(position);
        return NULL;
    }
    Py_DECREF(timestamp);
    self->used += size;
    /* The record is in: from here a collection letting another thread in is
     * harmless. */
    PyObject *future = self->future_type->tp_alloc(self->future_type, 2);
    if (future == NULL) {
        Py_DECREF(position);
        return NULL;
    }
    Py_INCREF(self->result);
    PyTuple_SET_ITEM(future, 0, self->result);
    PyTuple_SET_ITEM(future, 1, position);
    return future;
}

PyDoc_STRVAR(lane_close_doc,
"close() -> int\n\n"
"Refuse every later append; return the bytes appended (0 if already closed).");

static PyObject *
lane_close(Lane *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed) {
        return PyLong_FromLong(0);
    }
    self->closed = 1;
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

static PyMethodDef lane_methods[] = {
    {"append", (PyCFunction)lane_append, METH_O, lane_append_doc},
    {"close", (PyCFunction)lane_close, METH_NOARGS, lane_close_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lane_getset[] = {
    {"used", (getter)lane_get_used, NULL, "bytes appended so far", NULL},
    {"room", (getter)lane_get_room, NULL, "bytes granted", NULL},
    {"closed", (getter)lane_get_closed, NULL, "whether close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(lane_doc,
"Lane(values, timestamps, result, future_type, room, max_record, overhead)\n\n"
"A grant of `room` bytes in one open batch (its `values` and `timestamps`\n"
"lists and its BatchResult) for records of no key and no headers, each\n"
"counted `overhead` + len(value) bytes; see tidelog._accumulator.");

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
    .m_slots = cproduce_slots,
};

PyMODINIT_FUNC
PyInit__cproduce(void)
{
    return PyModuleDef_Init(&cproduce_module);
}
