/*
 * tidelog._crecords: the consumer's per-record loop in C (optional).
 *
 * What it owns: turning the checked columns of one batch body into record
 * tuples, one C loop per batch; and keeping the arenas those records free
 * for the next ones (keep_freed_arenas, which tidelog/_memory_reuse.py
 * decides to call). Nothing else: the format, its checks and the
 * pure-Python twin of this loop live in tidelog/records.py
 * (`decode_records_at`), which calls this module when it was compiled and falls
 * back to its own loop when not. Both must return the same records; the
 * tests run both on the same batches (tests/unit/sdk/test_crecords.py).
 *
 * Why C: a consumer of small records spends most of its CPU building one
 * tuple, two ints and one or two bytes objects per record. In Python that is
 * ~200 ns per record even with every step in C-implemented builtins (map,
 * zip, accumulate); one C loop over the columns does it in about a third
 * (~70 ns per 100-byte record here).
 *
 * Trust: the caller has already checked the columns against each other and
 * the body (records.py `_read_columns`: counts, strictly increasing deltas,
 * length totals). This loop checks again what it relies on to stay in
 * memory bounds (every slice inside the blob, no length below -1, column
 * sizes agreeing), so a caller's mistake is a ValueError, never a bad read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A read-only buffer argument and the element size it must have. */
typedef struct {
    Py_buffer view;
    int held;
} Column;

static int
column_get(PyObject *obj, Column *col, Py_ssize_t itemsize, const char *name)
{
    col->held = 0;
    if (obj == Py_None) {
        return 0;
    }
    if (PyObject_GetBuffer(obj, &col->view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    col->held = 1;
    if (itemsize > 1 && col->view.len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     name, col->view.len, itemsize);
        return -1;
    }
    return 0;
}

static void
column_release(Column *col)
{
    if (col->held) {
        PyBuffer_Release(&col->view);
        col->held = 0;
    }
}

/* An int32 column item (native byte order, as array('i') holds it). */
static inline int32_t
i32_at(const Column *col, Py_ssize_t i)
{
    int32_t v;
    memcpy(&v, (const char *)col->view.buf + i * 4, 4);
    return v;
}

/* The payload of length n at *pos in the blob (None for -1), *pos moved past it. */
static PyObject *
payload_at(const char *blob, Py_ssize_t blob_len, Py_ssize_t *pos, int32_t n, const char *what)
{
    if (n < 0) {
        if (n != -1) {
            PyErr_Format(PyExc_ValueError, "malformed batch body: a %s length is %d", what, (int)n);
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (n > blob_len - *pos) {
        PyErr_Format(PyExc_ValueError,
                     "malformed batch body: a %s of %d bytes runs past the end of the body",
                     what, (int)n);
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(blob + *pos, n);
    *pos += n;
    return out;
}

PyDoc_STRVAR(build_records_doc,
"build_records(record_type, topic, partition, timestamp_type, leader_epoch,\n"
"              blob, payload_pos, base_offset, deltas, timestamps, timestamp,\n"
"              key_lengths, value_lengths, headers, no_headers, start) -> list\n"
"\n"
"The records of one checked batch body with offset >= start, each\n"
"record_type((topic, partition, offset, timestamp, timestamp_type, key,\n"
"value, headers, leader_epoch)) built as a tuple of that type. Keys start at\n"
"blob[payload_pos], the values follow them (records.py's body layout).\n"
"deltas (uint32) and timestamps (int64) may be None: offsets are then\n"
"base_offset + i and every timestamp is `timestamp`; headers None gives\n"
"every record `no_headers`. Raises ValueError when the columns disagree.");

static PyObject *
build_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 16) {
        PyErr_Format(PyExc_TypeError, "build_records() takes 16 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *record_type = args[0];
    PyObject *topic = args[1], *partition = args[2];
    PyObject *timestamp_type = args[3], *leader_epoch = args[4];
    PyObject *timestamp = args[10], *headers = args[13], *no_headers = args[14];

    if (!PyType_Check(record_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "build_records: record_type must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)record_type;
    Py_ssize_t payload_pos = PyLong_AsSsize_t(args[6]);
    if (payload_pos == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[7]);
    if (base_offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[15]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (headers != Py_None && !PyList_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "build_records: headers must be a list or None");
        return NULL;
    }

    Column blob = {0}, deltas = {0}, stamps = {0}, key_lengths = {0}, value_lengths = {0};
    PyObject *out = NULL;
    if (column_get(args[5], &blob, 1, "blob") < 0 ||
        column_get(args[8], &deltas, 4, "deltas") < 0 ||
        column_get(args[9], &stamps, 8, "timestamps") < 0 ||
        column_get(args[11], &key_lengths, 4, "key_lengths") < 0 ||
        column_get(args[12], &value_lengths, 4, "value_lengths") < 0) {
        goto done;
    }
    if (!blob.held || !key_lengths.held || !value_lengths.held) {
        PyErr_SetString(PyExc_TypeError, "build_records: blob and the length columns are required");
        goto done;
    }
    Py_ssize_t count = value_lengths.view.len / 4;
    if (key_lengths.view.len / 4 != count || (deltas.held && deltas.view.len / 4 != count) ||
        (stamps.held && stamps.view.len / 8 != count) ||
        (headers != Py_None && PyList_GET_SIZE(headers) != count)) {
        PyErr_Format(PyExc_ValueError,
                     "malformed batch body: its columns do not all hold %zd records", count);
        goto done;
    }
    const char *data = blob.view.buf;
    Py_ssize_t data_len = blob.view.len;
    if (payload_pos < 0 || payload_pos > data_len) {
        PyErr_Format(PyExc_ValueError, "build_records: payload_pos %zd is outside the blob of %zd bytes",
                     payload_pos, data_len);
        goto done;
    }

    /* Keys come first, then values: two cursors, the values' starting after
     * every key. Records before `start` are walked (their payloads move the
     * cursors) but not built. */
    Py_ssize_t key_pos = payload_pos, value_pos = payload_pos;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t n = i32_at(&key_lengths, i);
        if (n < -1) {
            PyErr_Format(PyExc_ValueError, "malformed batch body: a key length is %d", (int)n);
            goto done;
        }
        if (n > 0) {
            if (n > data_len - value_pos) {
                PyErr_SetString(PyExc_ValueError,
                                "malformed batch body: the keys run past the end of the body");
                goto done;
            }
            value_pos += n;
        }
    }
    const Py_ssize_t keys_end = value_pos;

    Py_ssize_t first = 0;
    if (deltas.held) {
        while (first < count) {
            uint32_t d;
            memcpy(&d, (const char *)deltas.view.buf + first * 4, 4);
            if (base_offset + (long long)d >= start) {
                break;
            }
            first++;
        }
    } else if (start > base_offset) {
        first = start - base_offset < count ? (Py_ssize_t)(start - base_offset) : count;
    }
    for (Py_ssize_t i = 0; i < first; i++) {
        int32_t k = i32_at(&key_lengths, i), v = i32_at(&value_lengths, i);
        key_pos += k > 0 ? k : 0;
        if (v < -1 || (v > 0 && v > data_len - value_pos)) {
            PyErr_SetString(PyExc_ValueError,
                            "malformed batch body: a value runs past the end of the body");
            goto done;
        }
        value_pos += v > 0 ? v : 0;
    }

    out = PyList_New(count - first);
    if (out == NULL) {
        goto done;
    }
    for (Py_ssize_t i = first; i < count; i++) {
        long long offset = base_offset + i;
        if (deltas.held) {
            uint32_t d;
            memcpy(&d, (const char *)deltas.view.buf + i * 4, 4);
            offset = base_offset + (long long)d;
        }
        PyObject *record = type->tp_alloc(type, 9);
        if (record == NULL) {
            goto fail;
        }
        /* The list owns the record at once: a failure below frees it with
         * the list, its unset items being NULL. */
        PyList_SET_ITEM(out, i - first, record);
        PyObject *item;
        Py_INCREF(topic);
        PyTuple_SET_ITEM(record, 0, topic);
        Py_INCREF(partition);
        PyTuple_SET_ITEM(record, 1, partition);
        if ((item = PyLong_FromLongLong(offset)) == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(record, 2, item);
        if (stamps.held) {
            int64_t ts;
            memcpy(&ts, (const char *)stamps.view.buf + i * 8, 8);
            if ((item = PyLong_FromLongLong(ts)) == NULL) {
                goto fail;
            }
        } else {
            item = Py_NewRef(timestamp);
        }
        PyTuple_SET_ITEM(record, 3, item);
        Py_INCREF(timestamp_type);
        PyTuple_SET_ITEM(record, 4, timestamp_type);
        if ((item = payload_at(data, keys_end, &key_pos, i32_at(&key_lengths, i), "key")) == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(record, 5, item);
        if ((item = payload_at(data, data_len, &value_pos, i32_at(&value_lengths, i), "value")) ==
            NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(record, 6, item);
        item = headers == Py_None ? no_headers : PyList_GET_ITEM(headers, i);
        PyTuple_SET_ITEM(record, 7, Py_NewRef(item));
        PyTuple_SET_ITEM(record, 8, Py_NewRef(leader_epoch));
    }
    goto done;

fail:
    Py_CLEAR(out);
done:
    column_release(&blob);
    column_release(&deltas);
    column_release(&stamps);
    column_release(&key_lengths);
    column_release(&value_lengths);
    return out;
}

/*
 * A cache of freed arenas (keep_freed_arenas).
 *
 * CPython's small-object allocator takes memory from the OS in arenas
 * (1 MiB on 64-bit 3.11) and gives each back (munmap) as soon as it is empty,
 * keeping at most one. A consumer builds and drops millions of small objects
 * a second, so arenas come and go at that pace, and every page of a new one
 * costs a page fault to map again: a third of a 100-byte-record consumer's
 * CPU here (perf). This allocator sits in front of the one it replaces and
 * keeps up to a bound of freed arenas mapped for the next request; over the
 * bound, or for a size it has not seen, it hands straight through. The GIL
 * is held for every call (the small-object allocator requires it).
 */
#define ARENA_CACHE_SLOTS 4096
/* pymalloc's arena size (ARENA_BITS in Objects/obmalloc.c, 3.10+: 1 MiB
 * where pointers are 64-bit, 256 KiB otherwise). Only blocks of exactly this
 * size are kept: the same allocator also serves other sizes (the
 * interpreter's 16 KiB frame-stack chunks), which pass straight through. */
#define ARENA_BYTES ((size_t)1 << (SIZEOF_VOID_P > 4 ? 20 : 18))

static PyObjectArenaAllocator arenas_underneath;
static int arena_cache_installed = 0;
static void *arena_cache[ARENA_CACHE_SLOTS];
static Py_ssize_t arenas_cached = 0;
static Py_ssize_t arena_cache_limit = 0; /* in arenas */

static void *
cached_arena_alloc(void *ctx, size_t size)
{
    if (arenas_cached > 0 && size == ARENA_BYTES) {
        return arena_cache[--arenas_cached];
    }
    return arenas_underneath.alloc(arenas_underneath.ctx, size);
}

static void
cached_arena_free(void *ctx, void *ptr, size_t size)
{
    if (ptr != NULL && size == ARENA_BYTES && arenas_cached < arena_cache_limit) {
        arena_cache[arenas_cached++] = ptr;
        return;
    }
    arenas_underneath.free(arenas_underneath.ctx, ptr, size);
}

PyDoc_STRVAR(keep_freed_arenas_doc,
"keep_freed_arenas(max_bytes) -> int\n"
"\n"
"Keep up to max_bytes of the small-object allocator's freed arenas mapped\n"
"for reuse instead of returning them to the OS (0: keep none, and give back\n"
"what is kept). Process-wide; the first call installs the cache in front of\n"
"the current arena allocator. Returns the previous bound in bytes.");

static PyObject *
keep_freed_arenas(PyObject *module, PyObject *arg)
{
    long long max_bytes = PyLong_AsLongLong(arg);
    if (max_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "keep_freed_arenas: max_bytes must be >= 0");
        return NULL;
    }
    long long previous = (long long)arena_cache_limit * (long long)ARENA_BYTES;
    if (!arena_cache_installed && max_bytes > 0) {
        PyObjectArenaAllocator ours = {NULL, cached_arena_alloc, cached_arena_free};
        PyObject_GetArenaAllocator(&arenas_underneath);
        PyObject_SetArenaAllocator(&ours);
        arena_cache_installed = 1;
    }
    long long slots = max_bytes / (long long)ARENA_BYTES;
    arena_cache_limit = slots > ARENA_CACHE_SLOTS ? ARENA_CACHE_SLOTS : (Py_ssize_t)slots;
    while (arenas_cached > arena_cache_limit) {
        void *ptr = arena_cache[--arenas_cached];
        arenas_underneath.free(arenas_underneath.ctx, ptr, ARENA_BYTES);
    }
    return PyLong_FromLongLong(previous);
}

static PyMethodDef crecords_methods[] = {
    {"build_records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL, build_records_doc},
    {"keep_freed_arenas", keep_freed_arenas, METH_O, keep_freed_arenas_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef crecords_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog._crecords",
    .m_doc = "The consumer's per-record loop in C; see tidelog.records.build_records.",
    .m_size = 0,
    .m_methods = crecords_methods,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    return PyModuleDef_Init(&crecords_module);
}
