/*
 * tidelog._crecords: the consumer's per-record loop in C (optional).
 *
 * What it owns: turning the checked columns of one batch body into record
 * tuples, one C loop per batch; the columnar read's column pass over the
 * bodies of one fetch answer (arrow_columns, see its section below) and the
 * hand-over of its buffers to pyarrow (export_struct, the same); the
 * broker's search of a timestamp column for ListOffsets (first_at_or_after,
 * see records.py `first_record_at_or_after`); and
 * keeping the arenas those records free for the next ones
 * (keep_freed_arenas, which tidelog/_memory_reuse.py decides to call).
 * Nothing else: the format, its checks and the pure-Python twin of the
 * record loop live in tidelog/records.py (`decode_records_at`), which calls
 * this module when it was compiled and falls back to its own loop when not.
 * Both must return the same records; the tests run both on the same batches
 * (tests/unit/sdk/test_crecords.py).
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
#include <stdio.h>
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
 * The columnar read's column pass (arrow_columns).
 *
 * What it owns: reading and checking the number columns of the stored
 * batch bodies of one fetch answer, and writing the Arrow buffers of the
 * whole answer from them: the offsets, the timestamps in microseconds, and
 * for keys and for values an offsets buffer and a validity bitmap. One call
 * per fetch answer, where the Python twin (tidelog/columnar.py,
 * `_column_pass_py`: records.py `_read_columns` per body, then numpy) makes
 * some twenty numpy and array calls per stored batch. Both must give the
 * same buffers and the same first error; the tests run both on the same
 * fetches (tests/unit/sdk/test_columnar_c.py).
 *
 * Why C: on the paper's workload (1,250 records of 200 B per answer) those
 * small calls cost ~30 us per answer warm and about twice that in a running
 * consumer, a fifth of the client's CPU per answer; this pass is ~3 us.
 *
 * Trust: none. The bodies are checked here exactly as `_read_columns`
 * checks them (the same rules, in the same order, with the same messages),
 * and only column items inside a checked body are read; payload bytes are
 * never read at all (Python slices them out of the body by the totals).
 */

/* One stored batch: its (uncompressed) body and what the header says. */
typedef struct {
    Py_buffer view;
    int held;
    long long base_offset, count, last_offset_delta, timestamp;
    int use_timestamp_column;
    /* Set by body_read: the body flags, where each column starts (-1: absent). */
    int flags;
    Py_ssize_t deltas_at, stamps_at, keys_at, values_at, headers_at, payload_at;
    long long key_bytes, value_bytes, key_nulls, value_nulls;
} Body;

#define FLAG_OFFSET_DELTAS 0x01
#define FLAG_TIMESTAMPS 0x02
#define FLAG_HEADERS 0x04
#define KNOWN_FLAGS (FLAG_OFFSET_DELTAS | FLAG_TIMESTAMPS | FLAG_HEADERS)

static inline int32_t
i32_in(const char *p, Py_ssize_t i)
{
    int32_t v;
    memcpy(&v, p + i * 4, 4);
    return v;
}

static inline uint32_t
u32_in(const char *p, Py_ssize_t i)
{
    uint32_t v;
    memcpy(&v, p + i * 4, 4);
    return v;
}

static inline int64_t
i64_in(const char *p, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, p + i * 8, 8);
    return v;
}

/* records.py `_payload_bytes` of a length column: the bytes it claims (a
 * -1 holds none) and its nulls; a length below -1 is refused, naming the
 * column's smallest length as Python does. Returns NULL, or the message. */
static PyObject *
length_column(const char *p, Py_ssize_t n, const char *column, long long *bytes,
              long long *nulls)
{
    long long total = 0, nn = 0;
    int32_t smallest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v = i32_in(p, i);
        if (v >= 0) {
            total += v;
        } else {
            nn++;
            if (v < smallest) {
                smallest = v;
            }
        }
    }
    if (smallest < -1) {
        return PyUnicode_FromFormat("malformed batch body: a %s length is %d", column,
                                    (int)smallest);
    }
    *bytes = total;
    *nulls = nn;
    return NULL;
}

/* `_read_columns` for one body: fills the column positions and totals, or
 * returns the message of the first rule the body breaks (a new reference;
 * NULL with no exception set when the body is sound). */
static PyObject *
body_read(Body *b)
{
    const char *p = b->view.buf;
    Py_ssize_t size = b->view.len;
    long long count = b->count;
    if (size < 1) {
        return PyUnicode_FromString(
            "malformed batch body: empty (a body starts with a flags byte)");
    }
    int flags = (unsigned char)p[0];
    if (flags & ~KNOWN_FLAGS) {
        char hex[8]; /* Python's f"{flags:#04x}" */
        snprintf(hex, sizeof hex, "0x%02x", flags);
        return PyUnicode_FromFormat("malformed batch body: unknown body flags %s", hex);
    }
    long long per_record = 8 + (flags & FLAG_OFFSET_DELTAS ? 4 : 0) +
                           (flags & FLAG_TIMESTAMPS ? 8 : 0) + (flags & FLAG_HEADERS ? 4 : 0);
    long long fits = ((long long)size - 1) / per_record;
    if (count < 1 || count > fits) {
        return PyUnicode_FromFormat(
            "malformed batch: record_count %lld does not fit in a body of %zd bytes "
            "(at most %lld records of %lld column bytes each)",
            count, size, fits, per_record);
    }
    /* From here every column of `count` items lies inside the body. */
    Py_ssize_t n = (Py_ssize_t)count, pos = 1;
    b->flags = flags;
    b->deltas_at = b->stamps_at = b->headers_at = -1;
    if (flags & FLAG_OFFSET_DELTAS) {
        const char *d = p + pos;
        uint32_t last = u32_in(d, n - 1);
        if ((long long)last != b->last_offset_delta) {
            return PyUnicode_FromFormat(
                "malformed batch: last_offset_delta %lld but the body's last offset delta is %lu",
                b->last_offset_delta, (unsigned long)last);
        }
        for (Py_ssize_t i = 1; i < n; i++) {
            if (u32_in(d, i - 1) >= u32_in(d, i)) {
                return PyUnicode_FromString(
                    "malformed batch body: offset deltas do not strictly increase");
            }
        }
        b->deltas_at = pos;
        pos += 4 * n;
    } else if (b->last_offset_delta != count - 1) {
        return PyUnicode_FromFormat(
            "malformed batch: last_offset_delta %lld with record_count %lld and dense offsets "
            "(expected %lld)",
            b->last_offset_delta, count, count - 1);
    }
    if (flags & FLAG_TIMESTAMPS) {
        b->stamps_at = pos;
        pos += 8 * n;
    }
    b->keys_at = pos;
    pos += 4 * n;
    b->values_at = pos;
    pos += 4 * n;
    PyObject *message;
    if ((message = length_column(p + b->keys_at, n, "key", &b->key_bytes, &b->key_nulls)) ||
        (message = length_column(p + b->values_at, n, "value", &b->value_bytes,
                                 &b->value_nulls))) {
        return message;
    }
    long long header_bytes = 0, header_nulls;
    if (flags & FLAG_HEADERS) {
        b->headers_at = pos;
        pos += 4 * n;
        if ((message = length_column(p + b->headers_at, n, "header block", &header_bytes,
                                     &header_nulls))) {
            return message;
        }
    }
    long long payload = b->key_bytes + b->value_bytes + header_bytes;
    if (payload != (long long)(size - pos)) {
        return PyUnicode_FromFormat(
            "malformed batch body: the length columns of %lld records add up to %lld bytes, "
            "the body holds %zd after them",
            count, payload, size - pos);
    }
    b->payload_at = pos;
    return NULL;
}

/* A new bytes object of n bytes, uninitialised (filled by the caller). */
static PyObject *
new_bytes(Py_ssize_t n, char **out)
{
    PyObject *obj = PyBytes_FromStringAndSize(NULL, n);
    if (obj != NULL) {
        *out = PyBytes_AS_STRING(obj);
    }
    return obj;
}

/* The Arrow offsets (count + 1 int32) and validity bitmap (NULL: no nulls)
 * of one payload column across the bodies; `which` 0 keys, 1 values. */
static int
binary_buffers(Body *bodies, Py_ssize_t nb, Py_ssize_t total, int which, long long nulls,
               PyObject **ends_out, PyObject **validity_out)
{
    char *ends_p, *bits_p = NULL;
    PyObject *ends = new_bytes(4 * (total + 1), &ends_p), *validity = NULL;
    if (ends == NULL) {
        return -1;
    }
    if (nulls > 0) {
        validity = new_bytes((total + 7) / 8, &bits_p);
        if (validity == NULL) {
            Py_DECREF(ends);
            return -1;
        }
        memset(bits_p, 0, (total + 7) / 8);
    }
    unsigned char *bits = (unsigned char *)bits_p;
    int32_t at = 0;
    Py_ssize_t row = 0;
    memcpy(ends_p, &at, 4);
    for (Py_ssize_t k = 0; k < nb; k++) {
        const char *lengths = (const char *)bodies[k].view.buf +
                              (which ? bodies[k].values_at : bodies[k].keys_at);
        for (Py_ssize_t i = 0; i < (Py_ssize_t)bodies[k].count; i++, row++) {
            int32_t v = i32_in(lengths, i);
            if (v >= 0) {
                at += v; /* no overflow: the caller checked the total is below 2^31 */
                if (bits != NULL) {
                    bits[row >> 3] |= (unsigned char)(1u << (row & 7));
                }
            }
            memcpy(ends_p + 4 * (row + 1), &at, 4);
        }
    }
    *ends_out = ends;
    *validity_out = validity != NULL ? validity : Py_NewRef(Py_None);
    return 0;
}

PyDoc_STRVAR(arrow_columns_doc,
"arrow_columns(bodies, batches) -> (checked, error, count, offsets, timestamps,\n"
"    key_ends, key_validity, key_nulls, value_ends, value_validity, value_nulls, spans)\n"
"\n"
"The column pass of tidelog.columnar over the uncompressed bodies of one fetch\n"
"answer's stored batches, batches[i] = (base_offset, record_count,\n"
"last_offset_delta, timestamp, use_timestamp_column) from body i's header.\n"
"Bodies are checked in order as records.py `_read_columns` checks them;\n"
"`checked` is how many passed and `error` the message of the first that did\n"
"not (None: all did). The buffers (bytes) cover the `count` records of the\n"
"checked bodies: int64 offsets, int64 timestamps in microseconds, and per\n"
"payload column Arrow int32 offsets, a validity bitmap (None: no nulls) and\n"
"its null count. spans[i] = (payload_at, key_bytes, value_bytes, headers_at)\n"
"of checked body i (headers_at -1: no header column). Raises ValueError when\n"
"a payload column holds 2 GiB or more (Arrow's int32 offsets).");

static PyObject *
arrow_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "arrow_columns(bodies, batches): two lists of the same length");
        return NULL;
    }
    Py_ssize_t nb = PyList_GET_SIZE(args[0]);
    Body *bodies = PyMem_Calloc(nb > 0 ? nb : 1, sizeof(Body));
    if (bodies == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *out = NULL, *error = NULL, *spans = NULL;
    PyObject *offsets = NULL, *stamps = NULL;
    PyObject *key_ends = NULL, *key_validity = NULL, *value_ends = NULL, *value_validity = NULL;
    Py_ssize_t checked = 0;
    long long total = 0, key_bytes = 0, value_bytes = 0, key_nulls = 0, value_nulls = 0;
    for (; checked < nb; checked++) {
        Body *b = &bodies[checked];
        PyObject *meta = PyList_GET_ITEM(args[1], checked);
        if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 5) {
            PyErr_SetString(PyExc_TypeError, "arrow_columns: each batch is a tuple of 5 ints");
            goto done;
        }
        b->base_offset = PyLong_AsLongLong(PyTuple_GET_ITEM(meta, 0));
        b->count = PyLong_AsLongLong(PyTuple_GET_ITEM(meta, 1));
        b->last_offset_delta = PyLong_AsLongLong(PyTuple_GET_ITEM(meta, 2));
        b->timestamp = PyLong_AsLongLong(PyTuple_GET_ITEM(meta, 3));
        b->use_timestamp_column = PyObject_IsTrue(PyTuple_GET_ITEM(meta, 4));
        if (PyErr_Occurred()) {
            goto done;
        }
        if (PyObject_GetBuffer(PyList_GET_ITEM(args[0], checked), &b->view, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        b->held = 1;
        if ((error = body_read(b)) != NULL) {
            break;
        }
        if (PyErr_Occurred()) {
            goto done;
        }
        total += b->count;
        key_bytes += b->key_bytes;
        value_bytes += b->value_bytes;
        key_nulls += b->key_nulls;
        value_nulls += b->value_nulls;
    }
    if (error == NULL) {
        error = Py_NewRef(Py_None);
    }
    long long payload = key_bytes > value_bytes ? key_bytes : value_bytes;
    if (payload > INT32_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "%lld payload bytes do not fit one Arrow binary column (2 GiB)", payload);
        goto done;
    }
    char *offsets_p, *stamps_p;
    if ((offsets = new_bytes(8 * total, &offsets_p)) == NULL ||
        (stamps = new_bytes(8 * total, &stamps_p)) == NULL ||
        binary_buffers(bodies, checked, total, 0, key_nulls, &key_ends, &key_validity) < 0 ||
        binary_buffers(bodies, checked, total, 1, value_nulls, &value_ends, &value_validity) < 0 ||
        (spans = PyList_New(checked)) == NULL) {
        goto done;
    }
    Py_ssize_t row = 0;
    for (Py_ssize_t k = 0; k < checked; k++) {
        Body *b = &bodies[k];
        const char *p = b->view.buf;
        Py_ssize_t n = (Py_ssize_t)b->count;
        /* Unsigned arithmetic: a lying header wraps as numpy's int64 does,
         * never undefined behaviour. */
        uint64_t base = (uint64_t)b->base_offset;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t offset = base + (b->deltas_at >= 0 ? u32_in(p + b->deltas_at, i) : (uint64_t)i);
            memcpy(offsets_p + 8 * (row + i), &offset, 8);
        }
        if (b->use_timestamp_column && b->stamps_at >= 0) {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t us = (uint64_t)i64_in(p + b->stamps_at, i) * 1000u;
                memcpy(stamps_p + 8 * (row + i), &us, 8);
            }
        } else {
            uint64_t us = (uint64_t)b->timestamp * 1000u;
            for (Py_ssize_t i = 0; i < n; i++) {
                memcpy(stamps_p + 8 * (row + i), &us, 8);
            }
        }
        row += n;
        PyObject *span = Py_BuildValue("(nLLn)", b->payload_at, b->key_bytes, b->value_bytes,
                                       b->headers_at);
        if (span == NULL) {
            goto done;
        }
        PyList_SET_ITEM(spans, k, span);
    }
    out = Py_BuildValue("(nOLOOOOLOOLO)", checked, error, total, offsets, stamps, key_ends,
                        key_validity, key_nulls, value_ends, value_validity, value_nulls, spans);
done:
    for (Py_ssize_t k = 0; k < nb; k++) {
        if (bodies[k].held) {
            PyBuffer_Release(&bodies[k].view);
        }
    }
    PyMem_Free(bodies);
    Py_XDECREF(error);
    Py_XDECREF(spans);
    Py_XDECREF(offsets);
    Py_XDECREF(stamps);
    Py_XDECREF(key_ends);
    Py_XDECREF(key_validity);
    Py_XDECREF(value_ends);
    Py_XDECREF(value_validity);
    return out;
}

/*
 * Arrow arrays handed to pyarrow without a pyarrow call per buffer
 * (export_struct).
 *
 * What it owns: wrapping buffers the caller already has (the column pass's,
 * the fetched body's) as one struct ArrowArray of the Arrow C data interface
 * (https://arrow.apache.org/docs/format/CDataInterface.html), which
 * pyarrow imports in one call (RecordBatch._import_from_c). Each child
 * holds its buffers (a Py_buffer export each) until pyarrow releases it.
 *
 * Why: building a RecordBatch from buffers in Python takes some twenty
 * pyarrow calls per fetch answer (py_buffer, Array.from_buffers, slices,
 * RecordBatch.from_arrays): ~9 us warm, three times that in a running
 * consumer whose caches the network threads keep cold.
 *
 * Trust: pyarrow reads a C array's buffers without knowing their sizes, so
 * every buffer is checked here against what the column's type and length
 * make Arrow read: a binary column's offsets must start at 0, never
 * decrease and end inside its data. A buffer that does not hold that is a
 * ValueError, never handed over.
 */

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define MAX_BUFFERS 3

typedef struct {
    Py_buffer views[MAX_BUFFERS];
    int held[MAX_BUFFERS];
    const void *pointers[MAX_BUFFERS];
} ChildData;

typedef struct {
    Py_ssize_t n;
    const void *buffers[1]; /* the struct's validity: none */
    struct ArrowArray **pointers;
    struct ArrowArray *children;
} ParentData;

/* Gives back a child's buffer exports (from any thread: pyarrow may drop
 * its last reference anywhere). After the interpreter's end they are left. */
static void
child_release(struct ArrowArray *array)
{
    ChildData *data = array->private_data;
#if PY_VERSION_HEX >= 0x030D0000
    int finalizing = Py_IsFinalizing();
#else
    int finalizing = _Py_IsFinalizing();
#endif
    if (!finalizing) {
        PyGILState_STATE gil = PyGILState_Ensure();
        for (int i = 0; i < MAX_BUFFERS; i++) {
            if (data->held[i]) {
                PyBuffer_Release(&data->views[i]);
            }
        }
        PyGILState_Release(gil);
    }
    PyMem_RawFree(data);
    array->release = NULL;
}

static void
parent_release(struct ArrowArray *array)
{
    ParentData *data = array->private_data;
    for (Py_ssize_t i = 0; i < data->n; i++) {
        struct ArrowArray *child = &data->children[i];
        if (child->release != NULL) {
            child->release(child);
        }
    }
    PyMem_RawFree(data->children);
    PyMem_RawFree(data->pointers);
    PyMem_RawFree(data);
    array->release = NULL;
}

static void
capsule_release(PyObject *capsule)
{
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "tidelog.ArrowArray");
    if (array != NULL) {
        if (array->release != NULL) {
            array->release(array); /* never imported */
        }
        PyMem_RawFree(array);
    }
}

/* export_struct's kind of a binary column (other kinds: bytes per value). */
#define KIND_BINARY 0

/* Checks one column's buffers against its kind and length and fills the
 * child; -1 with an exception set when a buffer is short or lies. */
static int
child_fill(struct ArrowArray *child, PyObject *spec, Py_ssize_t index)
{
    Py_ssize_t length, null_count, kind;
    PyObject *buffers;
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "nnnO!", &length, &null_count, &kind, &PyTuple_Type, &buffers)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "export_struct: column %zd is not (length, null_count, kind, buffers)",
                         index);
        }
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(buffers);
    int binary = kind == KIND_BINARY;
    if (length < 0 || null_count < 0 || null_count > length ||
        !(binary || kind == 4 || kind == 8) || n != (binary ? 3 : 2)) {
        PyErr_Format(PyExc_ValueError,
                     "export_struct: column %zd: length %zd, null_count %zd, kind %zd and %zd "
                     "buffers do not make an Arrow column",
                     index, length, null_count, kind, n);
        return -1;
    }
    ChildData *data = PyMem_RawCalloc(1, sizeof(ChildData));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* Filled now so that a failure below releases what was taken. */
    *child = (struct ArrowArray){length, null_count, 0, n, 0, data->pointers, NULL, NULL,
                                 child_release, data};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(buffers, i);
        if (item == Py_None) {
            if (i == 0 && null_count == 0) {
                continue; /* no validity bitmap: no nulls */
            }
            PyErr_Format(PyExc_ValueError, "export_struct: column %zd lacks buffer %zd", index, i);
            return -1;
        }
        if (PyObject_GetBuffer(item, &data->views[i], PyBUF_SIMPLE) < 0) {
            return -1;
        }
        data->held[i] = 1;
        data->pointers[i] = data->views[i].buf;
    }
    /* What Arrow will read of each buffer. */
    if (data->held[0] && data->views[0].len < (length + 7) / 8) {
        PyErr_Format(PyExc_ValueError, "export_struct: column %zd: validity bitmap too short",
                     index);
        return -1;
    }
    if (!binary) {
        if (data->views[1].len / kind < length) {
            PyErr_Format(PyExc_ValueError, "export_struct: column %zd: values buffer too short",
                         index);
            return -1;
        }
        return 0;
    }
    if (data->views[1].len / 4 < length + 1) {
        PyErr_Format(PyExc_ValueError, "export_struct: column %zd: offsets buffer too short",
                     index);
        return -1;
    }
    const char *ends = data->views[1].buf;
    int32_t previous = i32_in(ends, 0);
    if (previous != 0) {
        PyErr_Format(PyExc_ValueError, "export_struct: column %zd: offsets do not start at 0",
                     index);
        return -1;
    }
    for (Py_ssize_t i = 1; i <= length; i++) {
        int32_t end = i32_in(ends, i);
        if (end < previous) {
            PyErr_Format(PyExc_ValueError, "export_struct: column %zd: offsets decrease", index);
            return -1;
        }
        previous = end;
    }
    if ((Py_ssize_t)previous > data->views[2].len) {
        PyErr_Format(PyExc_ValueError,
                     "export_struct: column %zd: offsets end at %d, past its %zd data bytes",
                     index, (int)previous, data->views[2].len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(export_struct_doc,
"export_struct(length, columns) -> (capsule, address)\n"
"\n"
"A struct ArrowArray (Arrow C data interface) of `length` rows whose children\n"
"are `columns`, each (length, null_count, kind, buffers): kind 0 a binary or\n"
"string column with buffers (validity or None, int32 offsets, data), kind 4\n"
"or 8 a fixed-width column of 4- or 8-byte values with (validity or None,\n"
"values). Every buffer is checked against what Arrow reads of it (ValueError\n"
"if short, or for offsets that do not start at 0, decrease or end past the\n"
"data) and held until pyarrow releases the array. `address` is for\n"
"pyarrow's RecordBatch._import_from_c; the capsule owns the struct (and\n"
"releases it if it was never imported): keep it until the import returns.");

static PyObject *
export_struct(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "export_struct(length, columns): columns is a list");
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[0]);
    if (length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[1]);
    struct ArrowArray *array = PyMem_RawCalloc(1, sizeof(struct ArrowArray));
    ParentData *data = PyMem_RawCalloc(1, sizeof(ParentData));
    struct ArrowArray *children = PyMem_RawCalloc(n > 0 ? n : 1, sizeof(struct ArrowArray));
    struct ArrowArray **pointers = PyMem_RawCalloc(n > 0 ? n : 1, sizeof(struct ArrowArray *));
    if (array == NULL || data == NULL || children == NULL || pointers == NULL) {
        PyMem_RawFree(array);
        PyMem_RawFree(data);
        PyMem_RawFree(children);
        PyMem_RawFree(pointers);
        return PyErr_NoMemory();
    }
    data->n = n;
    data->children = children;
    data->pointers = pointers;
    *array = (struct ArrowArray){length, 0, 0, 1, n, data->buffers, pointers, NULL,
                                 parent_release, data};
    PyObject *capsule = PyCapsule_New(array, "tidelog.ArrowArray", capsule_release);
    if (capsule == NULL) {
        parent_release(array);
        PyMem_RawFree(array);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        pointers[i] = &children[i];
        if (child_fill(&children[i], PyList_GET_ITEM(args[1], i), i) < 0) {
            Py_DECREF(capsule); /* releases what was filled */
            return NULL;
        }
        if (children[i].length != length) {
            PyErr_Format(PyExc_ValueError,
                         "export_struct: column %zd holds %lld rows, the struct %zd", i,
                         (long long)children[i].length, length);
            Py_DECREF(capsule);
            return NULL;
        }
    }
    return Py_BuildValue("(Nn)", capsule, (Py_ssize_t)(uintptr_t)array);
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

PyDoc_STRVAR(first_at_or_after_doc,
"first_at_or_after(timestamps, target) -> int\n"
"\n"
"The index of the first item of `timestamps` (a buffer of native int64,\n"
"array('q')) that is >= target, or -1 if none is. A ListOffsets lookup of\n"
"a batch of small records spent ~40 ns per record on this search in Python\n"
"(each item boxed into an int); here it is a plain loop over the buffer.");

static PyObject *
first_at_or_after(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first_at_or_after(timestamps, target)");
        return NULL;
    }
    /* A target outside int64 compares as Python compares it: above every
     * item, or below every one. */
    int overflow;
    long long target = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (target == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Column col;
    if (args[0] == Py_None) {
        PyErr_SetString(PyExc_TypeError, "first_at_or_after: timestamps is a buffer");
        return NULL;
    }
    if (column_get(args[0], &col, 8, "timestamps") < 0) {
        column_release(&col);
        return NULL;
    }
    const char *p = col.view.buf;
    Py_ssize_t n = col.view.len / 8;
    Py_ssize_t found = -1;
    if (overflow < 0) {
        found = n > 0 ? 0 : -1;
    }
    else if (overflow == 0) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i64_in(p, i) >= target) {
                found = i;
                break;
            }
        }
    }
    column_release(&col);
    return PyLong_FromSsize_t(found);
}

PyDoc_STRVAR(check_header_blocks_doc,
"check_header_blocks(blocks, lengths, check_utf8) -> None or tuple\n"
"\n"
"records.py `_check_header_blocks` in one C loop: walk every header block\n"
"(blocks: the body's tail where they are concatenated; lengths: int32, one\n"
"per record, <= 0 for none) without building a header. Each block is a\n"
"little-endian u16 count, then per header a u16 key length, the key (UTF-8,\n"
"checked when check_utf8), an i32 value length and the value (none for a\n"
"length <= 0). None when every block holds exactly its declared headers;\n"
"else ('mismatch', declared, taken) for a block whose headers do not fill\n"
"exactly its bytes, or ('malformed', why) for a read past the blocks' end\n"
"or a key that is not UTF-8: the caller raises the error. The Python walk\n"
"took ~0.3 us per header, on every produced batch that carries headers.");

static inline uint32_t
u16_le(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static inline int32_t
i32_le(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                     ((uint32_t)p[3] << 24));
}

static PyObject *
malformed_at(const char *what, Py_ssize_t at, Py_ssize_t size)
{
    return Py_BuildValue("(sN)", "malformed",
                         PyUnicode_FromFormat("a %s at byte %zd runs past the blocks' end (%zd bytes)",
                                              what, at, size));
}

static PyObject *
check_header_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "check_header_blocks(blocks, lengths, check_utf8)");
        return NULL;
    }
    int check_utf8 = PyObject_IsTrue(args[2]);
    if (check_utf8 < 0) {
        return NULL;
    }
    Column blocks_col, lengths_col;
    if (column_get(args[0], &blocks_col, 1, "blocks") < 0 || args[0] == Py_None) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "check_header_blocks: blocks is a buffer");
        }
        column_release(&blocks_col);
        return NULL;
    }
    if (column_get(args[1], &lengths_col, 4, "lengths") < 0 || args[1] == Py_None) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "check_header_blocks: lengths is a buffer");
        }
        column_release(&lengths_col);
        column_release(&blocks_col);
        return NULL;
    }
    const unsigned char *b = blocks_col.view.buf;
    Py_ssize_t size = blocks_col.view.len;
    Py_ssize_t n = lengths_col.view.len / 4;
    Py_ssize_t pos = 0;
    PyObject *problem = NULL;
    for (Py_ssize_t i = 0; i < n && problem == NULL; i++) {
        int32_t length = i32_at(&lengths_col, i);
        if (length <= 0) {
            continue;
        }
        Py_ssize_t end = pos + length;
        if (pos + 2 > size) {
            problem = malformed_at("header count", pos, size);
            break;
        }
        uint32_t count = u16_le(b + pos);
        Py_ssize_t at = pos + 2;
        for (uint32_t h = 0; h < count; h++) {
            if (at + 2 > size) {
                problem = malformed_at("header key length", at, size);
                break;
            }
            Py_ssize_t klen = (Py_ssize_t)u16_le(b + at);
            if (check_utf8) {
                /* As the Python walk: the key as far as the blocks reach. */
                Py_ssize_t have = size - (at + 2) < klen ? size - (at + 2) : klen;
                PyObject *key = PyUnicode_DecodeUTF8((const char *)b + at + 2, have, "strict");
                if (key == NULL) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        break; /* memory: raised as it is */
                    }
                    PyErr_Clear();
                    problem = Py_BuildValue("(ss)", "malformed", "a header key is not UTF-8");
                    break;
                }
                Py_DECREF(key);
            }
            if (at + 2 + klen + 4 > size) {
                problem = malformed_at("header value length", at + 2 + klen, size);
                break;
            }
            int32_t vlen = i32_le(b + at + 2 + klen);
            at += 6 + klen + (vlen > 0 ? vlen : 0);
            if (at > end) {
                break;
            }
        }
        if (problem == NULL && !PyErr_Occurred() && at != end) {
            problem = Py_BuildValue("(snn)", "mismatch", (Py_ssize_t)length, at - pos);
        }
        if (PyErr_Occurred()) {
            break;
        }
        pos = end;
    }
    column_release(&lengths_col);
    column_release(&blocks_col);
    if (PyErr_Occurred()) {
        Py_XDECREF(problem);
        return NULL;
    }
    if (problem == NULL) {
        Py_RETURN_NONE;
    }
    return problem;
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
    {"arrow_columns", (PyCFunction)(void (*)(void))arrow_columns, METH_FASTCALL,
     arrow_columns_doc},
    {"export_struct", (PyCFunction)(void (*)(void))export_struct, METH_FASTCALL,
     export_struct_doc},
    {"first_at_or_after", (PyCFunction)(void (*)(void))first_at_or_after, METH_FASTCALL,
     first_at_or_after_doc},
    {"check_header_blocks", (PyCFunction)(void (*)(void))check_header_blocks, METH_FASTCALL,
     check_header_blocks_doc},
    {"keep_freed_arenas", keep_freed_arenas, METH_O, keep_freed_arenas_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef crecords_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tidelog._crecords",
    .m_doc = "The consumer's per-record loop, the columnar read's column pass and the "
              "broker's timestamp search in C; "
              "see tidelog.records and tidelog.columnar.",
    .m_size = 0,
    .m_methods = crecords_methods,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    return PyModuleDef_Init(&crecords_module);
}
