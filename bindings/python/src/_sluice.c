/*
 * _sluice.c: the CPython 3.11 extension under the `sluice` package.
 *
 * This file is the thin layer between Python objects and sluice.h; the
 * package's Python code (sluice/__init__.py) builds the public API on it.
 * Three types:
 *
 *   Model   one sluice_model. close() only asks for the close: the model is
 *           really closed when nothing uses it any more, that is when no
 *           Handle is alive, no Stream runs and no call is on its way out
 *           of the library in another thread. So an array that outlives
 *           close() never sees its memory freed under it.
 *   Handle  one sluice_tensor, exported read-only through the buffer
 *           protocol: NumPy and torch arrays are made over it without a
 *           copy, and keep it (and so the model) alive. Its dealloc
 *           releases the tensor.
 *   Stream  one sluice_stream run on a thread of its own, whose callback
 *           hands each delivery to the Python iterator and returns once
 *           Python has taken it, so no delivery waits outside the
 *           library's reach (see STREAM_QUEUE).
 *
 * Every call that can wait (open, acquire, close, stream waits) releases
 * the GIL. Every counter below is changed with the GIL held only.
 * Errors are raised as instances of the classes of sluice/_errors.py,
 * made by its make_error(code, message) function, with the library's
 * message unchanged but for bytes that are not UTF-8 (U+FFFD; see
 * msg_str). File paths are given as os.fsdecode gives them (path_str).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sluice.h"

/* Deliveries a stream may have waiting for the Python consumer: one, and
 * the callback that put it there returns only once Python has taken it.
 * While a callback runs the library counts its stream's room as coming
 * back (it demands nothing more for that stream), whereas a handle left
 * in a queue after the callback returned is room held outside the library:
 * a queue of two, the tensor the consumer holds and the stream's next
 * read filled a pool of four tensors and failed the next one with
 * SLUICE_E_POOL_EXHAUSTED. So a consumer that drops each tensor before
 * taking the next needs a pool of 2 of the largest tensors (the one it
 * holds, the one handed over); the library's read-ahead keeps reading
 * meanwhile, into free room only. */
#define STREAM_QUEUE 1

/* How often a Python thread waiting on a stream looks for signals
 * (Ctrl-C): well under the 2 s a user waits before pressing it again. */
#define STREAM_SIGNAL_MS 100

static PyObject *make_error_fn; /* sluice._errors.make_error */

/* The strings the library gives, as str. Never strict UTF-8: a path is
 * any bytes but NUL, and a message may quote one, or be cut to a buffer's
 * size in the middle of a character.
 *
 * msg_str: a message, for people: UTF-8, an invalid byte becomes U+FFFD.
 * path_str: a file path, as os.fsdecode gives it (the file system encoding,
 *   surrogateescape): os.fsencode gives the bytes back. None for NULL.
 * str_from: a tensor name or metadata text (n bytes): UTF-8, which the
 *   header parser validated; surrogateescape all the same, never a
 *   decoding error. */
static PyObject *msg_str(const char *s)
{
    if (!s)
        s = "";
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *path_str_n(const char *s, size_t n)
{
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefaultAndSize(s, (Py_ssize_t)n);
}

static PyObject *path_str(const char *s)
{
    return path_str_n(s, s ? strlen(s) : 0);
}

static PyObject *str_from(const char *s, size_t n)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "surrogateescape");
}

/* Raises the exception for code with message (copied). Returns NULL. */
static PyObject *raise_code(int code, const char *message)
{
    if (!message || !*message)
        message = sluice_strerror(code);
    PyObject *text = msg_str(message);
    if (!text)
        return NULL;
    PyObject *exc = PyObject_CallFunction(make_error_fn, "iN", code, text);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* O& converters for unsigned integers that refuse, with OverflowError,
 * what the C type cannot hold (negative included): PyArg's K and I would
 * wrap it silently (2**64 + 4096 as 4096). */
static int u64_arg(PyObject *arg, void *out)
{
    PyObject *i = PyNumber_Index(arg);
    if (!i)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *(unsigned long long *)out = v;
    return 1;
}

static int u32_arg(PyObject *arg, void *out)
{
    unsigned long long v;
    if (!u64_arg(arg, &v))
        return 0;
    if (v > UINT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%R is too large (at most %lu)", arg,
                     (unsigned long)UINT32_MAX);
        return 0;
    }
    *(unsigned int *)out = (unsigned int)v;
    return 1;
}

/* ------------------------------------------------------------------ Model */

typedef struct {
    PyObject_HEAD
    sluice_model *m;      /* NULL once really closed */
    int close_requested;  /* close() was called: no new call may start */
    Py_ssize_t live;      /* Handles alive */
    Py_ssize_t streams;   /* Streams not yet joined */
    Py_ssize_t in_flight; /* calls running with the GIL released */
    int close_status;     /* what the deferred sluice_close returned */
} ModelObject;

static PyTypeObject ModelType;
static PyTypeObject HandleType;
static PyTypeObject StreamType;

static PyObject *raise_model(ModelObject *self, int code)
{
    return raise_code(code, self->m ? sluice_errmsg(self->m) : NULL);
}

static int model_usable(ModelObject *self)
{
    if (!self->m || self->close_requested) {
        raise_code(SLUICE_E_INVAL, "the model is closed");
        return 0;
    }
    return 1;
}

#ifdef SLUICE_PY_TEST_HOOKS
/* The code the next sluice_close is to fail with, without closing (see
 * mod_fail_next_close). Built in for the tests only: through the binding,
 * whose counters keep every user of the model, the library's close cannot
 * fail. */
static int test_close_fault;
#endif

/* Closes the library's model now. The GIL is released while close waits
 * for reads in flight; self->m is cleared first so that no other Python
 * thread can start a call on it meanwhile. On failure message (size
 * bytes, may be NULL) gets the library's detail. */
static int model_do_close(ModelObject *self, char *message, size_t size)
{
    sluice_model *m = self->m;
    if (!m)
        return SLUICE_OK;
    self->m = NULL;
    int rc;
#ifdef SLUICE_PY_TEST_HOOKS
    int fault = test_close_fault;
    test_close_fault = 0;
#endif
    Py_BEGIN_ALLOW_THREADS
#ifdef SLUICE_PY_TEST_HOOKS
    if (fault) {
        rc = fault;
        if (message)
            snprintf(message, size, "close failed (test hook)");
    } else
#endif
    {
        rc = sluice_close(m);
        if (rc != SLUICE_OK && message) /* per thread: read on this one */
            snprintf(message, size, "%s", sluice_errmsg(m));
    }
    Py_END_ALLOW_THREADS
    if (rc != SLUICE_OK) {
        /* Cannot happen while the counters are right (close waits for
         * every user). Keep the model rather than free it under a user:
         * a leak, never a use after free. close() again, or the
         * collection of the object, tries again. */
        self->m = m;
    }
    self->close_status = rc;
    return rc;
}

/* Nothing uses the model: no Handle alive, no Stream running, no call on
 * its way out of the library in another thread. */
static int model_idle(ModelObject *self)
{
    return self->live == 0 && self->streams == 0 && self->in_flight == 0;
}

/* The deferred close: called whenever a user of the model goes away. A
 * failure there has no caller to be raised to: close_status keeps it (and
 * the model stays open; see model_do_close). */
static void model_maybe_close(ModelObject *self)
{
    if (self->close_requested && self->m && model_idle(self))
        model_do_close(self, NULL, 0);
}

static void model_dealloc(ModelObject *self)
{
    /* Handles and Streams hold references, so none is alive here. */
    if (self->m)
        model_do_close(self, NULL, 0);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* close(): while Handles, Streams or calls use the model, the close is
 * deferred to the last of them (model_maybe_close): that is by design, no
 * failure. Otherwise the library's model is closed now, and a failure of
 * that is raised (the model then stays open in the library, still closed
 * to new calls; close() again tries again). */
static PyObject *model_close(ModelObject *self, PyObject *unused)
{
    int retry = self->close_requested && self->m && self->close_status != SLUICE_OK;
    if (self->close_requested && !retry)
        Py_RETURN_NONE;
    self->close_requested = 1;
    if (!self->m || !model_idle(self))
        Py_RETURN_NONE;
    char message[1024] = "";
    int rc = model_do_close(self, message, sizeof message);
    if (rc != SLUICE_OK)
        return raise_code(rc, message);
    Py_RETURN_NONE;
}

/* True when the Python object has asked to close (whatever the library's
 * model still does for live arrays). */
static PyObject *model_get_closed(ModelObject *self, void *unused)
{
    return PyBool_FromLong(self->close_requested || !self->m);
}

/* True while the library's model is still open (live arrays after close). */
static PyObject *model_get_open_in_library(ModelObject *self, void *unused)
{
    return PyBool_FromLong(self->m != NULL);
}

static PyObject *model_get_live(ModelObject *self, void *unused)
{
    return PyLong_FromSsize_t(self->live);
}

static PyObject *model_count(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    return PyLong_FromSize_t(sluice_count(self->m));
}

static PyObject *info_tuple(const struct sluice_tensor_info *ti)
{
    PyObject *shape = PyTuple_New(ti->ndim);
    if (!shape)
        return NULL;
    for (uint32_t d = 0; d < ti->ndim; d++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ti->shape[d]);
        if (!v) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, v);
    }
    PyObject *name = str_from(ti->name, ti->name_len);
    if (!name) {
        Py_DECREF(shape);
        return NULL;
    }
    PyObject *file = path_str(ti->file);
    if (!file) {
        Py_DECREF(name);
        Py_DECREF(shape);
        return NULL;
    }
    /* N steals the references to name, shape and file. */
    return Py_BuildValue("(NsNKNKnnKK)", name, sluice_dtype_name(ti->dtype), shape,
                         (unsigned long long)ti->nbytes, file,
                         (unsigned long long)ti->offset, (Py_ssize_t)ti->file_index,
                         (Py_ssize_t)ti->index, (unsigned long long)ti->data_begin,
                         (unsigned long long)ti->data_end);
}

static int index_arg(ModelObject *self, PyObject *arg, size_t *out)
{
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0 || (size_t)i >= sluice_count(self->m)) {
        PyErr_SetString(PyExc_IndexError, "tensor index out of range");
        return -1;
    }
    *out = (size_t)i;
    return 0;
}

/* info(i) -> (name, dtype, shape, nbytes, file, offset, file_index, index,
 *             data_begin, data_end) */
static PyObject *model_info(ModelObject *self, PyObject *arg)
{
    size_t i;
    if (!model_usable(self) || index_arg(self, arg, &i) < 0)
        return NULL;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    int rc = sluice_info(self->m, i, &ti);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    return info_tuple(&ti);
}

/* find(name) -> index, or -1 when the model has no such tensor. */
static PyObject *model_find(ModelObject *self, PyObject *arg)
{
    if (!model_usable(self))
        return NULL;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "a tensor name must be str, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!s) {
        /* A lone surrogate cannot be in a valid UTF-8 header: not found. */
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    int rc = sluice_find_n(self->m, s, (size_t)n, &ti);
    if (rc == SLUICE_E_NOT_FOUND)
        return PyLong_FromLong(-1);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    return PyLong_FromSize_t(ti.index);
}

static PyObject *model_names(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    size_t n = sluice_count(self->m);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        int rc = sluice_info(self->m, i, &ti);
        if (rc != SLUICE_OK) {
            Py_DECREF(list);
            return raise_model(self, rc);
        }
        PyObject *name = str_from(ti.name, ti.name_len);
        if (!name) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, name);
    }
    return list;
}

static PyObject *model_file_count(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    return PyLong_FromSize_t(sluice_file_count(self->m));
}

/* file_info(i) -> (path, file_size, header_bytes, data_start, tensor_count,
 *                  metadata) with metadata None (absent or null) or a dict. */
static PyObject *model_file_info(ModelObject *self, PyObject *arg)
{
    if (!model_usable(self))
        return NULL;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || (size_t)i >= sluice_file_count(self->m)) {
        PyErr_SetString(PyExc_IndexError, "file index out of range");
        return NULL;
    }
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    int rc = sluice_file_info(self->m, (size_t)i, &fi);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    PyObject *meta;
    if (fi.metadata_kind == SLUICE_METADATA_OBJECT) {
        meta = PyDict_New();
        if (!meta)
            return NULL;
        for (size_t k = 0; k < fi.metadata_count; k++) {
            PyObject *key = str_from(fi.metadata[k].key, fi.metadata[k].key_len);
            PyObject *val = key ? str_from(fi.metadata[k].value, fi.metadata[k].value_len) : NULL;
            if (!val || PyDict_SetItem(meta, key, val) < 0) {
                Py_XDECREF(key);
                Py_XDECREF(val);
                Py_DECREF(meta);
                return NULL;
            }
            Py_DECREF(key);
            Py_DECREF(val);
        }
    } else {
        meta = Py_NewRef(Py_None);
    }
    PyObject *path = path_str(fi.path);
    if (!path) {
        Py_DECREF(meta);
        return NULL;
    }
    return Py_BuildValue("(NKKKnN)", path, (unsigned long long)fi.file_size,
                         (unsigned long long)fi.header_bytes,
                         (unsigned long long)fi.data_start, (Py_ssize_t)fi.tensor_count, meta);
}

static PyObject *model_stats(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    struct sluice_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    int rc = sluice_stats(self->m, &st);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    const char *backend = st.backend == SLUICE_BACKEND_IO_URING ? "io_uring"
                          : st.backend == SLUICE_BACKEND_PREAD  ? "pread"
                                                                : "none";
#define U(x) (unsigned long long)(x)
    PyObject *d = Py_BuildValue(
        "{s:s,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I}",
        "backend", backend, "backend_errno", st.backend_errno, "bytes_read", U(st.bytes_read),
        "bytes_delivered", U(st.bytes_delivered), "bytes_hashed", U(st.bytes_hashed), "reads",
        U(st.reads), "retries", U(st.retries), "tensors_loaded", U(st.tensors_loaded),
        "tensors_verified", U(st.tensors_verified), "cache_hits", U(st.cache_hits), "failures",
        U(st.failures), "checksum_failures", U(st.checksum_failures), "direct_fallbacks",
        U(st.direct_fallbacks), "pool_bytes", U(st.pool_bytes), "pool_in_use",
        U(st.pool_in_use), "pool_high_water", U(st.pool_high_water), "evictions",
        U(st.evictions), "acquire_wait_ns", U(st.acquire_wait_ns), "acquire_count",
        U(st.acquire_count), "chunks_verified", U(st.chunks_verified), "hash_parallel_peak",
        (unsigned int)st.hash_parallel_peak);
#undef U
    /* The persistent cache's and the memo's counters, from a table: a
     * format string of thirty fields is past checking by eye. */
    const struct {
        const char *key;
        uint64_t value;
    } more[] = {
        {"disk_hits", st.disk_hits},       {"disk_hit_bytes", st.disk_hit_bytes},
        {"disk_misses", st.disk_misses},   {"disk_stored", st.disk_stored},
        {"disk_rotten", st.disk_rotten},   {"disk_evicted", st.disk_evicted},
        {"memo_tensors", st.memo_tensors}, {"memo_bytes", st.memo_bytes},
        {"disk_degraded", st.disk_degraded}, {"disk_busy", st.disk_busy},
        {"unverified", st.unverified},
        {"part_fallback_bytes", st.part_fallback_bytes},
        /* remote sources and mirrors */
        {"remote_reads", st.remote_reads}, {"remote_bytes", st.remote_bytes},
        {"remote_retries", st.remote_retries}, {"remote_open_requests", st.remote_open_requests},
        {"remote_open_bytes", st.remote_open_bytes}, {"fallback_tensors", st.fallback_tensors},
        {"fallback_bytes", st.fallback_bytes}, {"fallback_failures", st.fallback_failures},
        {"proxy_failures", st.proxy_failures}, {"proxy_bypass_bytes", st.proxy_bypass_bytes},
    };
    for (size_t k = 0; d && k < sizeof more / sizeof *more; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(more[k].value);
        if (!v || PyDict_SetItemString(d, more[k].key, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* cache_warning() -> why the model's persistent cache was turned off, else
 * the memo's refusal of a file, else the note that writes of its index were
 * put off (sluice_cache_warning), or None. The library's string lives until
 * sluice_close, which cannot run while this holds the GIL. */
static PyObject *model_cache_warning(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    const char *w = sluice_cache_warning(self->m);
    if (!w)
        Py_RETURN_NONE;
    return msg_str(w);
}

static PyObject *model_verify_mode(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    switch (sluice_verify_mode(self->m)) {
    case SLUICE_VERIFY_REQUIRE: return PyUnicode_FromString("require");
    case SLUICE_VERIFY_IF_PRESENT: return PyUnicode_FromString("if_present");
    default: return PyUnicode_FromString("off");
    }
}

/* verify_state() -> (state, where): sluice_verify_state's value (0 verified,
 * 1 no manifest found, 2 verification off) and where (the manifest, or the
 * sidecars looked for; None when off). */
static PyObject *model_verify_state(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    const char *where = NULL;
    int state = sluice_verify_state(self->m, &where);
    if (state < 0)
        return raise_model(self, state);
    PyObject *w = where ? msg_str(where) : (Py_INCREF(Py_None), Py_None);
    if (!w)
        return NULL;
    return Py_BuildValue("(iN)", state, w);
}

static PyObject *model_manifest_path(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    return path_str(sluice_manifest_path(self->m));
}

/* location() -> (location, fallback, why): sluice_model_location: the
 * location that serves the model's index, 0 or the 1-based mirror serving
 * it, and why the locations before it could not (None: none). */
static PyObject *model_location(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    unsigned fallback = 0;
    const char *why = NULL, *loc = sluice_model_location(self->m, &fallback, &why);
    PyObject *l = loc ? msg_str(loc) : Py_NewRef(Py_None);
    PyObject *w = !l ? NULL : why ? msg_str(why) : Py_NewRef(Py_None);
    if (!w) {
        Py_XDECREF(l);
        return NULL;
    }
    return Py_BuildValue("(NIN)", l, fallback, w);
}

/* manifest_entry(i) -> None when the manifest does not check tensor i,
 * else (digest, chunks): the 32-byte digest it gives, and chunks None or
 * (chunk_bytes, count) of its chunk digests. */
static PyObject *model_manifest_entry(ModelObject *self, PyObject *arg)
{
    size_t i;
    if (!model_usable(self) || index_arg(self, arg, &i) < 0)
        return NULL;
    uint8_t d[32];
    uint64_t bytes = 0;
    uint32_t count = 0;
    int rc = sluice_manifest_tensor(self->m, i, d);
    if (rc == SLUICE_E_NOT_FOUND)
        Py_RETURN_NONE;
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    rc = sluice_manifest_chunks(self->m, i, &bytes, &count);
    if (rc != SLUICE_OK && rc != SLUICE_E_NOT_FOUND)
        return raise_model(self, rc);
    if (rc == SLUICE_E_NOT_FOUND)
        return Py_BuildValue("(y#O)", (const char *)d, (Py_ssize_t)32, Py_None);
    return Py_BuildValue("(y#(KI))", (const char *)d, (Py_ssize_t)32, (unsigned long long)bytes,
                         (unsigned int)count);
}

/* digest_algorithm() -> "sha256" or "blake3": what the model checks with. */
static PyObject *model_digest_algorithm(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    const char *name = sluice_algorithm_name(sluice_digest_algorithm(self->m));
    return PyUnicode_FromString(name ? name : "unknown");
}

/* manifest_version() -> 0 (flat, or none read), 1 or 2. */
static PyObject *model_manifest_version(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    return PyLong_FromLong(sluice_manifest_version(self->m));
}

/* ----------------------------------------------------------------- Handle */

typedef struct {
    PyObject_HEAD
    ModelObject *model; /* strong */
    sluice_tensor *t;
    size_t index;
} HandleObject;

/* Wraps a live handle; on failure releases it. Called with the GIL. */
static PyObject *handle_new(ModelObject *model, sluice_tensor *t, size_t index)
{
    HandleObject *h = PyObject_New(HandleObject, &HandleType);
    if (!h) {
        sluice_release(t);
        return NULL;
    }
    h->model = (ModelObject *)Py_NewRef((PyObject *)model);
    h->t = t;
    h->index = index;
    model->live++;
    return (PyObject *)h;
}

static void handle_dealloc(HandleObject *self)
{
    ModelObject *model = self->model;
    if (self->t) {
        sluice_release(self->t);
        self->t = NULL;
        model->live--;
        model_maybe_close(model);
    }
    Py_DECREF(model);
    PyObject_Free(self);
}

/* Every empty tensor's buffer: NumPy wants a non-NULL pointer. */
static char empty_buffer[64];

static int handle_getbuffer(HandleObject *self, Py_buffer *view, int flags)
{
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError,
                        "sluice tensors are read-only: their bytes are the verified ones");
        view->obj = NULL;
        return -1;
    }
    const void *data = sluice_tensor_data(self->t);
    uint64_t n = sluice_tensor_size(self->t);
    if (!data || n == 0) {
        data = empty_buffer;
        n = 0;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, (void *)data, (Py_ssize_t)n, 1, flags);
}

static PyBufferProcs handle_as_buffer = {
    .bf_getbuffer = (getbufferproc)handle_getbuffer,
    .bf_releasebuffer = NULL,
};

static PyObject *handle_get_address(HandleObject *self, void *unused)
{
    return PyLong_FromVoidPtr((void *)sluice_tensor_data(self->t));
}

static PyObject *handle_get_nbytes(HandleObject *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(sluice_tensor_size(self->t));
}

static PyObject *handle_get_index(HandleObject *self, void *unused)
{
    return PyLong_FromSize_t(self->index);
}

static PyObject *handle_get_model(HandleObject *self, void *unused)
{
    return Py_NewRef((PyObject *)self->model);
}

/* digest() -> the SHA-256 the pipeline computed, or None when not hashed. */
static PyObject *handle_digest(HandleObject *self, PyObject *unused)
{
    uint8_t d[32];
    if (sluice_tensor_digest(self->t, d) != SLUICE_OK)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)d, 32);
}

/* source -> "" when the bytes came from the model's own files, else the
 * mirror and why (sluice_tensor_source). */
static PyObject *handle_get_source(HandleObject *self, void *unused)
{
    return msg_str(sluice_tensor_source(self->t));
}

static PyMethodDef handle_methods[] = {
    {"digest", (PyCFunction)handle_digest, METH_NOARGS,
     "The SHA-256 of the bytes as the library computed it, or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef handle_getset[] = {
    {"address", (getter)handle_get_address, NULL, "address of the first byte (0 when empty)", NULL},
    {"nbytes", (getter)handle_get_nbytes, NULL, "bytes of the tensor", NULL},
    {"index", (getter)handle_get_index, NULL, "the tensor's index in the model", NULL},
    {"model", (getter)handle_get_model, NULL, "the _sluice.Model it belongs to", NULL},
    {"source", (getter)handle_get_source, NULL,
     "where the bytes came from: '' (the model's files) or the mirror and why", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._sluice.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_as_buffer = &handle_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A live tensor handle; its buffer is the tensor's verified bytes (read-only).",
    .tp_methods = handle_methods,
    .tp_getset = handle_getset,
};

/* What one acquire asks for: the whole tensor (sluice_acquire_index);
 * bytes [begin, end) of it, by its name (sluice_acquire_range); or rank
 * `begin` of `world` equal parts of it along dim, by its name
 * (sluice_acquire_part). A range's handle owns its buffer, outside the
 * pool; a part's is in the pool; each counts as live. */
typedef enum acquire_kind { ACQUIRE_WHOLE, ACQUIRE_RANGE, ACQUIRE_PART } acquire_kind;

typedef struct acquire_req {
    acquire_kind kind;
    const char *name;       /* ACQUIRE_RANGE, ACQUIRE_PART */
    uint64_t begin, end;    /* ACQUIRE_RANGE; begin is the rank for ACQUIRE_PART */
    unsigned dim;           /* ACQUIRE_PART */
    uint64_t world;         /* ACQUIRE_PART */
} acquire_req;

/* The one acquire of the extension: a Handle on what req names of tensor
 * i. The GIL is released while the library reads. */
static PyObject *acquire_handle(ModelObject *self, size_t i, const acquire_req *req)
{
    sluice_tensor *t = NULL;
    int rc;
    char message[1024] = "";
    self->in_flight++;
    sluice_model *m = self->m;
    Py_BEGIN_ALLOW_THREADS
    switch (req->kind) {
    case ACQUIRE_RANGE:
        rc = sluice_acquire_range(m, req->name, req->begin, req->end, &t);
        break;
    case ACQUIRE_PART:
        rc = sluice_acquire_part(m, req->name, req->dim, req->begin, req->world, &t);
        break;
    default:
        rc = sluice_acquire_index(m, i, &t);
        break;
    }
    /* The detail is per thread: read it on this thread, before the GIL
     * lets another call on the model record its own. */
    if (rc != SLUICE_OK)
        snprintf(message, sizeof message, "%s", sluice_errmsg(m));
    Py_END_ALLOW_THREADS
    self->in_flight--;
    if (rc != SLUICE_OK) {
        model_maybe_close(self);
        return raise_code(rc, message);
    }
    PyObject *h = handle_new(self, t, i);
    model_maybe_close(self);
    return h;
}

/* acquire(i) -> Handle of the whole tensor. */
static PyObject *model_acquire(ModelObject *self, PyObject *arg)
{
    size_t i;
    if (!model_usable(self) || index_arg(self, arg, &i) < 0)
        return NULL;
    acquire_req whole = {.kind = ACQUIRE_WHOLE};
    return acquire_handle(self, i, &whole);
}

/* The tensor's name (borrowed until the library's model is closed) for
 * the calls that take a name. */
static const char *name_of(ModelObject *self, size_t i)
{
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    if (sluice_info(self->m, i, &ti) != SLUICE_OK) {
        raise_model(self, SLUICE_E_INVAL);
        return NULL;
    }
    if (strlen(ti.name) != ti.name_len) {
        /* sluice_read_into and sluice_acquire_range take NUL-terminated
         * names: a name holding a NUL cannot be passed to them. */
        raise_code(SLUICE_E_INVAL, "a tensor name holding a NUL cannot be read by range");
        return NULL;
    }
    return ti.name;
}

/* acquire_range(i, begin, end) -> Handle on bytes [begin, end) of tensor
 * i, read and verified (sluice_acquire_range). */
static PyObject *model_acquire_range(ModelObject *self, PyObject *args)
{
    PyObject *iarg;
    unsigned long long begin, end;
    if (!PyArg_ParseTuple(args, "OO&O&", &iarg, u64_arg, &begin, u64_arg, &end))
        return NULL;
    size_t i;
    if (!model_usable(self) || index_arg(self, iarg, &i) < 0)
        return NULL;
    const char *name = name_of(self, i);
    if (!name)
        return NULL;
    acquire_req range = {.kind = ACQUIRE_RANGE, .name = name, .begin = begin, .end = end};
    return acquire_handle(self, i, &range);
}

/* read_into(i, buffer, offset) -> bytes written: sluice_read_into of
 * min(len(buffer), nbytes - offset) bytes of tensor i from byte offset
 * into any writable C-contiguous buffer, verified before it returns (see
 * sluice.h); the GIL is released meanwhile, the buffer held (a bytearray
 * cannot be resized under the call). On failure the buffer's content is
 * unspecified. */
static PyObject *read_into_open(ModelObject *self, PyObject *args);

static PyObject *model_read_into(ModelObject *self, PyObject *args)
{
    if (!model_usable(self))
        return NULL;
    return read_into_open(self, args);
}

/* read_into on a library model known to be open (self->m set): by
 * Model.read_into, and by Stream.read_into while its stream keeps the
 * model open after a close(). */
static PyObject *read_into_open(ModelObject *self, PyObject *args)
{
    PyObject *iarg, *obj;
    unsigned long long offset;
    if (!PyArg_ParseTuple(args, "OOO&", &iarg, &obj, u64_arg, &offset))
        return NULL;
    size_t i;
    if (index_arg(self, iarg, &i) < 0)
        return NULL;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    int rc = sluice_info(self->m, i, &ti);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    if (offset > ti.nbytes) {
        PyErr_Format(PyExc_ValueError, "offset %llu is past the end of the tensor (%llu bytes)",
                     offset, (unsigned long long)ti.nbytes);
        return NULL;
    }
    const char *name = name_of(self, i);
    if (!name)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    uint64_t len = ti.nbytes - offset;
    if ((uint64_t)view.len < len)
        len = (uint64_t)view.len;
    char message[1024] = "";
    sluice_model *m = self->m;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_read_into(m, name, offset, view.buf, len);
    if (rc != SLUICE_OK)
        snprintf(message, sizeof message, "%s", sluice_errmsg(m));
    Py_END_ALLOW_THREADS
    self->in_flight--;
    PyBuffer_Release(&view);
    model_maybe_close(self);
    if (rc != SLUICE_OK)
        return raise_code(rc, message);
    return PyLong_FromUnsignedLongLong(len);
}

/* acquire_part(i, dim, rank, world) -> Handle of rank `rank` of `world`
 * equal parts of tensor i along dim (sluice_acquire_part: only the part's
 * bytes read when the manifest has part digests), in the handle's buffer
 * of the pool: the array over it is zero copy. The GIL is released
 * meanwhile. */
static PyObject *model_acquire_part(ModelObject *self, PyObject *args)
{
    PyObject *iarg;
    unsigned int dim;
    unsigned long long rank, world;
    if (!PyArg_ParseTuple(args, "OIO&O&", &iarg, &dim, u64_arg, &rank, u64_arg, &world))
        return NULL;
    size_t i;
    if (!model_usable(self) || index_arg(self, iarg, &i) < 0)
        return NULL;
    const char *name = name_of(self, i);
    if (!name)
        return NULL;
    acquire_req part = {.kind = ACQUIRE_PART, .name = name, .begin = rank, .dim = dim,
                        .world = world};
    return acquire_handle(self, i, &part);
}

/* part_note() -> the once-per-model note of a part checked by reading its
 * whole tensor (sluice_part_note), or None. */
static PyObject *model_part_note(ModelObject *self, PyObject *unused)
{
    (void)unused;
    if (!model_usable(self))
        return NULL;
    const char *note = sluice_part_note(self->m);
    if (!note)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(note, (Py_ssize_t)strlen(note), "replace");
}

/* part_dims(rules, [(name, ndim), ...]) -> [dim or -1 (replicated)]: the
 * rules text (str, or None for the built-in set) applied by the library
 * (sluice_part_rules_*); ValueError naming the line of a bad rule or the
 * tensor a rule gives a dim it lacks. */
static PyObject *mod_part_dims(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *text, *seq;
    if (!PyArg_ParseTuple(args, "OO", &text, &seq))
        return NULL;
    const char *s = NULL;
    Py_ssize_t len = 0;
    if (text != Py_None && !(s = PyUnicode_AsUTF8AndSize(text, &len)))
        return NULL;
    sluice_part_rules *r = NULL;
    char why[256];
    if (sluice_part_rules_parse(s, (size_t)len, &r, why, sizeof why) != SLUICE_OK) {
        PyErr_Format(PyExc_ValueError, "%s", why);
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "part_dims needs a sequence of (name, ndim)");
    PyObject *out = fast ? PyList_New(PySequence_Fast_GET_SIZE(fast)) : NULL;
    for (Py_ssize_t k = 0; out && k < PySequence_Fast_GET_SIZE(fast); k++) {
        const char *name;
        unsigned int ndim;
        int dim = SLUICE_PART_REPLICATED;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, k), "sI", &name, &ndim)) {
            Py_CLEAR(out);
        } else if (sluice_part_rules_dim(r, name, ndim, &dim) != SLUICE_OK) {
            PyErr_Format(PyExc_ValueError, "tensor %s: the rules split it along dim %d; it has %u",
                         name, dim, ndim);
            Py_CLEAR(out);
        } else {
            PyList_SET_ITEM(out, k, PyLong_FromLong(dim));
        }
    }
    Py_XDECREF(fast);
    sluice_part_rules_free(r);
    return out;
}

/* Borrowed names of tensors by index, valid until the model is closed.
 * Returns a malloc'd array or NULL with an exception set. */
static const char **names_from_indices(ModelObject *self, PyObject *seq, size_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, "tensor indices must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const char **names = PyMem_Calloc((size_t)n + 1, sizeof *names);
    if (!names) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        size_t i;
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        if (index_arg(self, PySequence_Fast_GET_ITEM(fast, k), &i) < 0 ||
            sluice_info(self->m, i, &ti) != SLUICE_OK) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "tensor index out of range");
            PyMem_Free(names);
            Py_DECREF(fast);
            return NULL;
        }
        names[k] = ti.name;
    }
    Py_DECREF(fast);
    *n_out = (size_t)n;
    return names;
}

/* prefetch(indices): the read-ahead hint (an empty list: model order). */
static PyObject *model_prefetch(ModelObject *self, PyObject *arg)
{
    if (!model_usable(self))
        return NULL;
    size_t n = 0;
    const char **names = names_from_indices(self, arg, &n);
    if (!names)
        return NULL;
    int rc = sluice_prefetch(self->m, n ? names : NULL, n);
    PyMem_Free(names);
    if (rc != SLUICE_OK)
        return raise_model(self, rc);
    Py_RETURN_NONE;
}

/* trim() -> bytes given back to the system. */
static PyObject *model_trim(ModelObject *self, PyObject *unused)
{
    if (!model_usable(self))
        return NULL;
    uint64_t released = 0;
    int rc;
    sluice_model *m = self->m;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_trim(m, &released);
    Py_END_ALLOW_THREADS
    self->in_flight--;
    if (rc != SLUICE_OK) {
        PyObject *r = raise_model(self, rc);
        model_maybe_close(self);
        return r;
    }
    model_maybe_close(self);
    return PyLong_FromUnsignedLongLong(released);
}

/* ----------------------------------------------------------------- verify */

/* A failed item of a verify, kept on the calling thread (GIL released). */
typedef struct {
    int kind;
    size_t index;
    int status;
    char *message; /* malloc'd; NULL: out of memory (strerror is used) */
    char *name;    /* malloc'd copy of the item's name (a file: its path) */
    size_t name_len;
} VerifyFailure;

typedef struct {
    VerifyFailure *v;
    size_t n, cap;
    int nomem;
} VerifyFailures;

static int verify_item(void *user, const struct sluice_verify_item *it)
{
    VerifyFailures *f = user;
    if (it->status == SLUICE_OK)
        return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        VerifyFailure *v = realloc(f->v, cap * sizeof *v);
        if (!v) {
            f->nomem = 1;
            return 1; /* stops the verify: its failures could not be kept */
        }
        f->v = v;
        f->cap = cap;
    }
    /* The name is copied here, so that the Python side needs no further
     * call on the model (which a close() meanwhile would refuse). */
    const char *name = it->name ? it->name : "";
    size_t name_len = it->name ? it->name_len : 0;
    char *copy = malloc(name_len + 1);
    if (!copy) {
        f->nomem = 1;
        return 1;
    }
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    f->v[f->n++] = (VerifyFailure){it->kind, it->index, it->status,
                                   it->message ? strdup(it->message) : NULL, copy, name_len};
    return 0;
}

/* verify(indices or None, files, threads) -> (code, message, failures,
 * report): failures a list of ("tensor" or "file", index, code, message,
 * name), name the tensor's name or the file's path (as os.fsdecode),
 * report a dict of struct sluice_verify_report. The GIL is released
 * while the library reads and hashes. */
static PyObject *model_verify(ModelObject *self, PyObject *args)
{
    PyObject *indices;
    int files;
    unsigned int threads;
    if (!PyArg_ParseTuple(args, "OpO&", &indices, &files, u32_arg, &threads) ||
        !model_usable(self))
        return NULL;
    const char **names = NULL;
    size_t n = 0;
    if (indices != Py_None && !(names = names_from_indices(self, indices, &n)))
        return NULL;
    sluice_verify_options o;
    sluice_verify_options_init(&o);
    o.flags = files ? SLUICE_VF_FILES : 0;
    o.threads = threads;
    VerifyFailures f = {0};
    o.on_item = verify_item;
    o.user = &f;
    struct sluice_verify_report r;
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    char message[1024] = "";
    int rc;
    sluice_model *m = self->m;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_verify(m, names, n, &o, &r);
    if (rc != SLUICE_OK) /* per thread: read before another call records its own */
        snprintf(message, sizeof message, "%s", sluice_errmsg(m));
    Py_END_ALLOW_THREADS
    self->in_flight--;
    PyMem_Free(names);
    PyObject *list = f.nomem ? NULL : PyList_New((Py_ssize_t)f.n);
    for (size_t k = 0; list && k < f.n; k++) {
        const VerifyFailure *v = &f.v[k];
        int file = v->kind == SLUICE_VERIFY_ITEM_FILE;
        PyObject *text = msg_str(v->message ? v->message : sluice_strerror(v->status));
        PyObject *name = !text ? NULL
                         : file ? path_str_n(v->name, v->name_len)
                                : str_from(v->name, v->name_len);
        if (!name)
            Py_XDECREF(text);
        PyObject *t = !name ? NULL
                            : Py_BuildValue("(sniNN)", file ? "file" : "tensor",
                                            (Py_ssize_t)v->index, v->status, text, name);
        if (!t)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)k, t);
    }
    for (size_t k = 0; k < f.n; k++) {
        free(f.v[k].message);
        free(f.v[k].name);
    }
    free(f.v);
    model_maybe_close(self);
    if (!list)
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    PyObject *text = msg_str(message);
    if (!text) {
        Py_DECREF(list);
        return NULL;
    }
#define U(x) (unsigned long long)(x)
    return Py_BuildValue("(iNN{s:n,s:n,s:n,s:n,s:K,s:K,s:I,s:K})", rc, text, list,
                         "tensors_ok", (Py_ssize_t)r.tensors_ok, "tensors_failed",
                         (Py_ssize_t)r.tensors_failed, "files_ok", (Py_ssize_t)r.files_ok,
                         "files_failed", (Py_ssize_t)r.files_failed, "bytes_hashed",
                         U(r.bytes_hashed), "bytes_direct", U(r.bytes_direct), "threads",
                         (unsigned int)r.threads, "elapsed_ns", U(r.elapsed_ns));
#undef U
}

/* ----------------------------------------------------------------- Stream */

typedef struct {
    sluice_tensor *t; /* NULL for a failure */
    int status;
    size_t index;
    char *message;    /* malloc'd, failures only */
} StreamItem;

typedef struct {
    PyObject_HEAD
    ModelObject *model;  /* strong */
    sluice_model *m;     /* model->m, kept open while this stream counts */
    const char **names;  /* borrowed from the model; NULL: every tensor */
    size_t n;
    pthread_t thread;
    int thread_started;
    int joined;
    pthread_mutex_t mu;
    pthread_cond_t item_ready;
    pthread_cond_t space_free;
    StreamItem queue[STREAM_QUEUE];
    size_t head, count;
    uint64_t given, taken; /* deliveries queued, taken by Python */
    int finished;        /* sluice_stream_ex returned */
    int abandoned;       /* the consumer stopped: drop further deliveries */
    int rc;              /* what it returned */
    char *final_message; /* its detail, read on the stream's thread */
    sluice_cancel *cancel; /* requested by stream_stop: a stream waiting on a
                              read (a remote one above all) returns at once */
} StreamObject;

static void stream_cond_init(pthread_cond_t *c);
static int stream_take(StreamObject *s, StreamItem *it, int *have);

static int stream_deliver(void *user, sluice_tensor *t, int status,
                          const struct sluice_tensor_info *info, const char *message)
{
    StreamObject *s = user;
    pthread_mutex_lock(&s->mu);
    while (s->count == STREAM_QUEUE && !s->abandoned)
        pthread_cond_wait(&s->space_free, &s->mu);
    if (s->abandoned) {
        pthread_mutex_unlock(&s->mu);
        sluice_release(t);
        return 1; /* stops the stream */
    }
    StreamItem *it = &s->queue[(s->head + s->count) % STREAM_QUEUE];
    it->t = t;
    it->status = status;
    it->index = info ? info->index : 0;
    it->message = (status != SLUICE_OK && message) ? strdup(message) : NULL;
    s->count++;
    uint64_t ticket = ++s->given;
    pthread_cond_signal(&s->item_ready);
    /* Returns once Python took it (see STREAM_QUEUE). Abandoned meanwhile:
     * stream_stop gives back what is left in the queue. */
    while (s->taken < ticket && !s->abandoned)
        pthread_cond_wait(&s->space_free, &s->mu);
    int stop = s->taken < ticket;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static void *stream_thread(void *arg)
{
    StreamObject *s = arg;
    sluice_model *m = s->m;
    sluice_stream_options so;
    sluice_stream_options_init(&so);
    so.cancel = s->cancel;
    int rc = sluice_stream_ex(m, s->names, s->names ? s->n : 0, stream_deliver, s, &so);
    char *msg = NULL;
    if (rc != SLUICE_OK)
        msg = strdup(sluice_errmsg(m));
    pthread_mutex_lock(&s->mu);
    s->rc = rc;
    s->final_message = msg;
    s->finished = 1;
    pthread_cond_broadcast(&s->item_ready);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* stream(indices or None) -> Stream, already running. */
static PyObject *model_stream(ModelObject *self, PyObject *arg)
{
    if (!model_usable(self))
        return NULL;
    const char **names = NULL;
    size_t n = 0;
    if (arg != Py_None) {
        names = names_from_indices(self, arg, &n);
        if (!names)
            return NULL;
    }
    StreamObject *s = PyObject_New(StreamObject, &StreamType);
    if (!s) {
        PyMem_Free(names);
        return NULL;
    }
    s->model = (ModelObject *)Py_NewRef((PyObject *)self);
    s->m = self->m;
    s->names = names;
    s->n = n;
    s->thread_started = 0;
    s->joined = 0;
    s->head = s->count = 0;
    s->given = s->taken = 0;
    s->finished = s->abandoned = 0;
    s->rc = SLUICE_OK;
    s->final_message = NULL;
    s->cancel = NULL;
    pthread_mutex_init(&s->mu, NULL);
    stream_cond_init(&s->item_ready);
    pthread_cond_init(&s->space_free, NULL);
    self->streams++;
    if (sluice_cancel_create(&s->cancel) != SLUICE_OK) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    int err = pthread_create(&s->thread, NULL, stream_thread, s);
    if (err != 0) {
        Py_DECREF(s); /* dealloc undoes the rest */
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    s->thread_started = 1;
    return (PyObject *)s;
}

/* Stops the stream (if running), waits for its thread and gives back every
 * delivery not taken. Idempotent. Called with the GIL. */
static void stream_stop(StreamObject *s)
{
    if (s->joined)
        return;
    s->joined = 1;
    if (s->thread_started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&s->mu);
        s->abandoned = 1;
        pthread_cond_broadcast(&s->space_free);
        pthread_mutex_unlock(&s->mu);
        sluice_cancel_request(s->cancel); /* no wait for reads in flight */
        pthread_join(s->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    /* Under s->mu: another thread may be in stream_next_item, taking an
     * item with the GIL released. What it took is its own (its in_flight
     * keeps the model open until it has made the item a Handle). */
    StreamItem left[STREAM_QUEUE];
    size_t nleft = 0;
    pthread_mutex_lock(&s->mu);
    while (s->count) {
        left[nleft++] = s->queue[s->head];
        s->head = (s->head + 1) % STREAM_QUEUE;
        s->count--;
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t k = 0; k < nleft; k++) {
        sluice_release(left[k].t);
        free(left[k].message);
    }
    s->model->streams--;
    model_maybe_close(s->model);
}

static void stream_dealloc(StreamObject *s)
{
    stream_stop(s);
    sluice_cancel_free(s->cancel);
    free(s->final_message);
    PyMem_Free(s->names);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->item_ready);
    pthread_cond_destroy(&s->space_free);
    Py_DECREF(s->model);
    PyObject_Free(s);
}

/* The tuple of next_item for a delivery taken from the queue; the
 * delivery's handle is given to a Handle, or released on failure. The
 * tensor's info is read here, while the stream keeps the library's model
 * open: the Python side needs no call on the model, which a close() since
 * the stream began would refuse. */
static PyObject *stream_item_tuple(StreamObject *s, StreamItem *it)
{
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    int rc = sluice_info(s->m, it->index, &ti);
    PyObject *info = rc == SLUICE_OK ? info_tuple(&ti) : raise_code(rc, sluice_errmsg(s->m));
    if (!info) {
        sluice_release(it->t);
        free(it->message);
        return NULL;
    }
    if (it->t) {
        PyObject *h = handle_new(s->model, it->t, it->index);
        if (!h) {
            Py_DECREF(info);
            return NULL;
        }
        return Py_BuildValue("(nNiON)", (Py_ssize_t)it->index, h, 0, Py_None, info);
    }
    PyObject *text = msg_str(it->message ? it->message : sluice_strerror(it->status));
    free(it->message);
    if (!text) {
        Py_DECREF(info);
        return NULL;
    }
    return Py_BuildValue("(nOiNN)", (Py_ssize_t)it->index, Py_None, it->status, text, info);
}

/* item_ready waits on the monotonic clock (stream_take's slices). */
static void stream_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* Waits at most STREAM_SIGNAL_MS for a delivery, without the GIL: takes
 * one into *it (*have = 1), or sees the end. Returns 1 when done waiting
 * (an item or the end), 0 when the slice ran out, so that the caller can
 * look for signals with the GIL (a Ctrl-C must not wait for the network). */
static int stream_take(StreamObject *s, StreamItem *it, int *have)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += STREAM_SIGNAL_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&s->mu);
    while (s->count == 0 && !s->finished)
        if (pthread_cond_timedwait(&s->item_ready, &s->mu, &until) == ETIMEDOUT)
            break;
    int done = s->count > 0 || s->finished;
    if (s->count) {
        *it = s->queue[s->head];
        s->head = (s->head + 1) % STREAM_QUEUE;
        s->count--;
        s->taken++;
        *have = 1;
        pthread_cond_signal(&s->space_free);
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* next_item() -> (index, Handle, 0, None, info) for a tensor, (index, None,
 * code, message, info) for a failure, None at the end (then see result());
 * info the tuple of Model.info. */
static PyObject *stream_next_item(StreamObject *s, PyObject *unused)
{
    if (s->joined)
        Py_RETURN_NONE;
    StreamItem it;
    int have = 0;
    /* A call on its way out: a stream_stop by another thread meanwhile
     * (Stream.close) cannot let the model close under the item taken. */
    ModelObject *model = s->model;
    model->in_flight++;
    for (;;) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = stream_take(s, &it, &have);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        /* Ctrl-C while waiting: the handler's exception (KeyboardInterrupt)
         * is raised here; the iterator's close() then cancels the stream. */
        if (PyErr_CheckSignals() < 0) {
            model->in_flight--;
            model_maybe_close(model);
            return NULL;
        }
    }
    PyObject *r;
    if (have) {
        r = stream_item_tuple(s, &it); /* its Handle now counts in live */
    } else {
        stream_stop(s);
        r = Py_NewRef(Py_None);
    }
    model->in_flight--;
    model_maybe_close(model);
    return r;
}

/* result() -> (code, message) of the finished stream. */
static PyObject *stream_result(StreamObject *s, PyObject *unused)
{
    if (!s->joined) {
        PyErr_SetString(PyExc_RuntimeError, "the stream has not finished");
        return NULL;
    }
    PyObject *text = msg_str(s->final_message ? s->final_message : sluice_strerror(s->rc));
    if (!text)
        return NULL;
    return Py_BuildValue("(iN)", s->rc, text);
}

static PyObject *stream_close(StreamObject *s, PyObject *unused)
{
    stream_stop(s);
    Py_RETURN_NONE;
}

/* read_into(i, buffer, offset): Model.read_into on the stream's model, for
 * a tensor the stream delivered no handle for (no pool room). The running
 * stream keeps the library's model open, so this works after a close()
 * since the stream began, as next_item does; once the stream is stopped
 * it is the model's (ClosedError after a close). */
static PyObject *stream_read_into(StreamObject *s, PyObject *args)
{
    if (s->joined)
        return model_read_into(s->model, args);
    return read_into_open(s->model, args);
}

static PyMethodDef stream_methods[] = {
    {"next_item", (PyCFunction)stream_next_item, METH_NOARGS, "The next delivery, or None."},
    {"result", (PyCFunction)stream_result, METH_NOARGS, "(code, message) once finished."},
    {"close", (PyCFunction)stream_close, METH_NOARGS, "Stop the stream and wait for it."},
    {"read_into", (PyCFunction)stream_read_into, METH_VARARGS,
     "read_into(i, buffer, offset) on the stream's model, open while the stream runs."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._sluice.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A running sluice_stream; see sluice.Model.stream.",
    .tp_methods = stream_methods,
};

/* ------------------------------------------------------------ Model type */

static PyObject *model_metrics_text(ModelObject *self, PyObject *arg);

/* write_manifest(path or None, fd, version, chunk_bytes, rules text,
 * "builtin" or None, worlds tuple, threads): sluice_manifest_write (GIL
 * released). */
static PyObject *model_write_manifest(ModelObject *self, PyObject *args)
{
    PyObject *path_obj = NULL, *worlds = NULL;
    int fd = -1, version = 2;
    unsigned long long chunk = 0;
    const char *rules_text = NULL;
    Py_ssize_t rules_len = 0;
    unsigned int threads = 0;
    if (!PyArg_ParseTuple(args, "OiiKz#O!I", &path_obj, &fd, &version, &chunk, &rules_text,
                          &rules_len, &PyTuple_Type, &worlds, &threads) || !model_usable(self))
        return NULL;
    sluice_manifest_options mo;
    sluice_manifest_options_init(&mo);
    mo.version = version;
    mo.chunk_bytes = chunk;
    mo.threads = threads;
    Py_ssize_t nw = PyTuple_GET_SIZE(worlds);
    if (nw > 8)
        return PyErr_Format(PyExc_ValueError, "at most 8 world sizes, not %zd", nw);
    for (Py_ssize_t k = 0; k < nw; k++) {
        mo.worlds[k] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(worlds, k));
        if (PyErr_Occurred())
            return NULL;
    }
    if (nw)
        mo.nworlds = (size_t)nw;
    sluice_part_rules *rules = NULL;
    if (rules_text) {
        char why[256];
        int builtin = !strcmp(rules_text, "builtin");
        if (sluice_part_rules_parse(builtin ? NULL : rules_text, builtin ? 0 : (size_t)rules_len,
                                    &rules, why, sizeof why) != SLUICE_OK)
            return PyErr_Format(PyExc_ValueError, "parts: %s", why);
        mo.parts = rules;
    }
    PyObject *bytes = NULL;
    if (path_obj != Py_None && !PyUnicode_FSConverter(path_obj, &bytes)) {
        sluice_part_rules_free(rules);
        return NULL;
    }
    const char *path = bytes ? PyBytes_AS_STRING(bytes) : NULL;
    sluice_model *m = self->m;
    int rc;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_manifest_write(m, path, fd, &mo);
    Py_END_ALLOW_THREADS
    self->in_flight--;
    Py_XDECREF(bytes);
    sluice_part_rules_free(rules);
    PyObject *r = rc == SLUICE_OK ? Py_NewRef(Py_None) : raise_model(self, rc);
    model_maybe_close(self);
    return r;
}

static PyMethodDef model_methods[] = {
    {"close", (PyCFunction)model_close, METH_NOARGS,
     "Close; deferred while arrays, streams or calls still use the model."},
    {"count", (PyCFunction)model_count, METH_NOARGS, "Number of tensors."},
    {"info", (PyCFunction)model_info, METH_O, "Information of tensor i."},
    {"find", (PyCFunction)model_find, METH_O, "Index of a tensor by name, or -1."},
    {"names", (PyCFunction)model_names, METH_NOARGS, "Every tensor name, in model order."},
    {"file_count", (PyCFunction)model_file_count, METH_NOARGS, "Number of files."},
    {"file_info", (PyCFunction)model_file_info, METH_O, "Information of file i."},
    {"stats", (PyCFunction)model_stats, METH_NOARGS, "Every field of sluice_stats."},
    {"cache_warning", (PyCFunction)model_cache_warning, METH_NOARGS,
     "Why the persistent cache was turned off, or the file the memo refused, or None."},
    {"verify_mode", (PyCFunction)model_verify_mode, METH_NOARGS, "Policy in force."},
    {"verify_state", (PyCFunction)model_verify_state, METH_NOARGS,
     "(state, where): what the model is checked against (sluice_verify_state)."},
    {"manifest_path", (PyCFunction)model_manifest_path, METH_NOARGS, "Manifest read, or None."},
    {"location", (PyCFunction)model_location, METH_NOARGS,
     "(location, fallback, why): sluice_model_location."},
    {"manifest_entry", (PyCFunction)model_manifest_entry, METH_O,
     "(digest, (chunk_bytes, count) or None) the manifest gives tensor i, or None."},
    {"acquire", (PyCFunction)model_acquire, METH_O, "Handle of tensor i (GIL released)."},
    {"acquire_range", (PyCFunction)model_acquire_range, METH_VARARGS,
     "Handle of bytes [begin, end) of tensor i, verified (GIL released)."},
    {"acquire_part", (PyCFunction)model_acquire_part, METH_VARARGS,
     "Handle of rank r of n parts of tensor i along a dim (GIL released)."},
    {"part_note", (PyCFunction)model_part_note, METH_NOARGS,
     "The note of a part checked by its whole tensor, or None."},
    {"read_into", (PyCFunction)model_read_into, METH_VARARGS,
     "Verified bytes of tensor i from offset into a writable buffer (GIL released)."},
    {"digest_algorithm", (PyCFunction)model_digest_algorithm, METH_NOARGS,
     "Algorithm of the digests checked."},
    {"manifest_version", (PyCFunction)model_manifest_version, METH_NOARGS,
     "Manifest version: 0 flat or none, 1 or 2."},
    {"prefetch", (PyCFunction)model_prefetch, METH_O, "Read-ahead hint by indices."},
    {"stream", (PyCFunction)model_stream, METH_O, "Start a stream over indices (or None)."},
    {"trim", (PyCFunction)model_trim, METH_NOARGS, "Give memory back; bytes released."},
    {"metrics_text", (PyCFunction)model_metrics_text, METH_O,
     "metrics_text(openmetrics) -> the model's exposition."},
    {"verify", (PyCFunction)model_verify, METH_VARARGS,
     "sluice_verify over indices (or None), files, threads (GIL released)."},
    {"write_manifest", (PyCFunction)model_write_manifest, METH_VARARGS,
     "sluice_manifest_write(path or None, fd, version, chunk, rules, worlds, threads)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"closed", (getter)model_get_closed, NULL, "close() was called", NULL},
    {"open_in_library", (getter)model_get_open_in_library, NULL,
     "the library's model is still open (live arrays keep it)", NULL},
    {"live_handles", (getter)model_get_live, NULL, "handles alive", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._sluice.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_dealloc = (destructor)model_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One open sluice_model; see sluice.open.",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
};

/* ---------------------------------------------------------------- module */

/* PyUnicode_FSConverter that also takes None (leaving *out NULL). */
static int fs_or_none(PyObject *arg, void *out)
{
    if (arg == Py_None) {
        *(PyObject **)out = NULL;
        return 1;
    }
    return PyUnicode_FSConverter(arg, out);
}

/* The paths of a sequence (not a str or bytes: one path is a mistake
 * here) as file system bytes, in *keys (a tuple of bytes; NULL for None),
 * and borrowed C strings in *paths (PyMem). Returns 0, or -1 with an
 * exception set. */
static int paths_arg(const char *what, PyObject *arg, PyObject **keys, const char ***paths,
                     size_t *n)
{
    *keys = NULL;
    *paths = NULL;
    *n = 0;
    if (arg == Py_None)
        return 0;
    if (PyUnicode_Check(arg) || PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of paths, not one path", what);
        return -1;
    }
    char msg[80];
    snprintf(msg, sizeof msg, "%s must be a list of paths", what);
    PyObject *fast = PySequence_Fast(arg, msg);
    if (!fast)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    PyObject *t = PyTuple_New(count);
    const char **v = PyMem_Calloc((size_t)count + 1, sizeof *v);
    if (!t || !v) {
        Py_DECREF(fast);
        Py_XDECREF(t);
        PyMem_Free(v);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, k), &b)) {
            Py_DECREF(fast);
            Py_DECREF(t);
            PyMem_Free(v);
            return -1;
        }
        PyTuple_SET_ITEM(t, k, b);
        v[k] = PyBytes_AS_STRING(b);
    }
    Py_DECREF(fast);
    *keys = t;
    *paths = v;
    *n = (size_t)count;
    return 0;
}

static int trusted_keys_arg(PyObject *arg, PyObject **keys, const char ***paths, size_t *n)
{
    return paths_arg("trusted_keys", arg, keys, paths, n);
}

/* ------------------------------------------------- remote models, mirrors */

/* One string option of the remote dict: bytes (file system encoding) kept
 * alive in keep until after sluice_open. Returns 0 (absent: *out left),
 * -1 with an exception. */
static int remote_str(PyObject *remote, const char *key, PyObject *keep, const char **out)
{
    PyObject *v = PyDict_GetItemString(remote, key); /* borrowed */
    if (!v || v == Py_None)
        return 0;
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(v, &b))
        return -1;
    int rc = PyList_Append(keep, b);
    Py_DECREF(b); /* keep holds it */
    if (rc < 0)
        return -1;
    *out = PyBytes_AS_STRING(b);
    return 0;
}

static int remote_u32(PyObject *remote, const char *key, uint32_t *out)
{
    PyObject *v = PyDict_GetItemString(remote, key);
    if (!v || v == Py_None)
        return 0;
    unsigned int u;
    if (!u32_arg(v, &u))
        return -1;
    *out = u;
    return 0;
}

/* The remote options of sluice.open, as a dict of the C names (the Python
 * layer checks and converts them): fallback (a list of locations),
 * http_token, s3_endpoint, s3_region, remote_ca_file, http_proxy, proxy_kind, s3_addressing,
 * remote_connections, remote_attempts, remote_deadline_ms. None or an
 * absent key: the library's default (and its environment variables).
 * *keep (a list, to be released after the open) holds the bytes the
 * strings point into; *fallback (PyMem) the array of mirrors. */
static int remote_opts_arg(PyObject *remote, sluice_options *o, PyObject **keep,
                           const char ***fallback)
{
    *keep = NULL;
    *fallback = NULL;
    if (remote == Py_None)
        return 0;
    if (!PyDict_Check(remote)) {
        PyErr_SetString(PyExc_TypeError, "remote must be a dict");
        return -1;
    }
    *keep = PyList_New(0);
    if (!*keep)
        return -1;
    if (remote_str(remote, "http_token", *keep, &o->http_token) < 0 ||
        remote_str(remote, "s3_endpoint", *keep, &o->s3_endpoint) < 0 ||
        remote_str(remote, "s3_region", *keep, &o->s3_region) < 0 ||
        remote_str(remote, "remote_ca_file", *keep, &o->remote_ca_file) < 0 ||
        remote_str(remote, "http_proxy", *keep, &o->http_proxy) < 0 ||
        remote_u32(remote, "proxy_kind", &o->proxy_kind) < 0 ||
        remote_u32(remote, "s3_addressing", &o->s3_addressing) < 0 ||
        remote_u32(remote, "remote_connections", &o->remote_connections) < 0 ||
        remote_u32(remote, "remote_attempts", &o->remote_attempts) < 0 ||
        remote_u32(remote, "remote_deadline_ms", &o->remote_deadline_ms) < 0)
        goto fail;
    PyObject *fb = PyDict_GetItemString(remote, "fallback");
    if (fb && fb != Py_None) {
        PyObject *fast = PySequence_Fast(fb, "fallback must be a list of locations");
        if (!fast)
            goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
        *fallback = PyMem_Calloc((size_t)n + 1, sizeof **fallback);
        if (!*fallback) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *b = NULL;
            if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, k), &b) ||
                PyList_Append(*keep, b) < 0) {
                Py_XDECREF(b);
                Py_DECREF(fast);
                goto fail;
            }
            Py_DECREF(b);
            (*fallback)[k] = PyBytes_AS_STRING(b);
        }
        Py_DECREF(fast);
        /* more than the library's 16 reach it as is: its SLUICE_E_INVAL */
        o->fallback = n ? *fallback : NULL;
        o->fallback_count = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    return 0;
fail:
    Py_CLEAR(*keep);
    PyMem_Free(*fallback);
    *fallback = NULL;
    return -1;
}

/* open(path, manifest, verify, pool, queue_depth, chunk, direct,
 *      hash_threads, io_threads, force_pread, trusted_keys, cache_dir,
 *      cache_bytes, trust_unchanged) -> Model. 0 (or -1 for the thread
 * counts) means the library's default; trusted_keys None or a sequence of
 * paths (an empty one: none; the library takes no empty list); cache_dir
 * None: the library's choice; cache_bytes None: the default, any int
 * (0 too, which the library refuses) given as is. */
static PyObject *mod_open(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "manifest", "verify", "pool", "queue_depth", "chunk",
                             "direct", "hash_threads", "io_threads", "force_pread",
                             "trusted_keys", "cache_dir", "cache_bytes", "trust_unchanged",
                             "trusted_cas", "signature_path", "remote", NULL};
    PyObject *path = NULL, *manifest = NULL, *trusted = Py_None, *cache_dir = NULL;
    PyObject *cas_arg = Py_None, *sig_path = NULL;
    PyObject *cache_bytes = Py_None, *remote = Py_None, *remote_keep = NULL;
    const char **fallback = NULL;
    int verify = SLUICE_VERIFY_DEFAULT, direct = 0, force_pread = 0, trust_unchanged = 0;
    unsigned long long pool = 0, chunk = 0;
    unsigned int queue_depth = 0;
    int hash_threads = -1, io_threads = -1;
    unsigned long long cache_budget = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&iO&O&O&piipOO&OpOO&O", kwlist,
                                     PyUnicode_FSConverter, &path, fs_or_none, &manifest,
                                     &verify, u64_arg, &pool, u32_arg, &queue_depth, u64_arg,
                                     &chunk, &direct, &hash_threads, &io_threads,
                                     &force_pread, &trusted, fs_or_none, &cache_dir,
                                     &cache_bytes, &trust_unchanged, &cas_arg, fs_or_none,
                                     &sig_path, &remote) ||
        (cache_bytes != Py_None && !u64_arg(cache_bytes, &cache_budget))) {
        Py_XDECREF(path);
        Py_XDECREF(manifest);
        Py_XDECREF(cache_dir);
        Py_XDECREF(sig_path);
        return NULL;
    }
    PyObject *keys, *cas = NULL;
    const char **key_paths, **ca_paths = NULL;
    size_t nkeys, ncas = 0;
    if (trusted_keys_arg(trusted, &keys, &key_paths, &nkeys) < 0 ||
        paths_arg("trusted_cas", cas_arg, &cas, &ca_paths, &ncas) < 0) {
        Py_XDECREF(keys);
        PyMem_Free(key_paths);
        Py_DECREF(path);
        Py_XDECREF(manifest);
        Py_XDECREF(cache_dir);
        Py_XDECREF(sig_path);
        return NULL;
    }
    sluice_options o;
    sluice_options_init(&o);
    o.verify = (sluice_verify_policy)verify;
    if (pool)
        o.pool_bytes = pool;
    if (queue_depth)
        o.queue_depth = queue_depth;
    if (chunk)
        o.chunk_bytes = chunk;
    if (hash_threads >= 0)
        o.hash_threads = (uint32_t)hash_threads;
    if (io_threads >= 0)
        o.io_threads = (uint32_t)io_threads;
    if (direct)
        o.flags |= SLUICE_F_DIRECT;
    if (force_pread)
        o.flags |= SLUICE_F_FORCE_PREAD;
    if (trust_unchanged)
        o.flags |= SLUICE_F_TRUST_UNCHANGED;
    /* cache_dir's bytes live until after sluice_open, which copies them. */
    o.cache_dir = cache_dir ? PyBytes_AS_STRING(cache_dir) : NULL;
    if (cache_bytes != Py_None)
        o.cache_bytes = cache_budget;
    o.manifest_path = manifest ? PyBytes_AS_STRING(manifest) : NULL;
    if (nkeys) {
        o.trusted_keys = key_paths;
        o.ntrusted_keys = nkeys;
    }
    if (ncas) {
        o.trusted_cas = ca_paths;
        o.ntrusted_cas = ncas;
    }
    o.signature_path = sig_path ? PyBytes_AS_STRING(sig_path) : NULL;
    if (remote_opts_arg(remote, &o, &remote_keep, &fallback) < 0) {
        Py_DECREF(path);
        Py_XDECREF(manifest);
        Py_XDECREF(cache_dir);
        Py_XDECREF(keys);
        PyMem_Free(key_paths);
        Py_XDECREF(cas);
        PyMem_Free(ca_paths);
        Py_XDECREF(sig_path);
        return NULL;
    }
    const char *cpath = PyBytes_AS_STRING(path);

    sluice_model *m = NULL;
    int rc;
    char message[2048] = "";
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_open(cpath, &o, &m);
    if (rc != SLUICE_OK) {
        snprintf(message, sizeof message, "%s", m ? sluice_errmsg(m) : "");
        sluice_close(m); /* the shell of a failed open */
        m = NULL;
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    Py_XDECREF(manifest);
    Py_XDECREF(cache_dir);
    Py_XDECREF(keys);
    PyMem_Free(key_paths);
    Py_XDECREF(cas);
    PyMem_Free(ca_paths);
    Py_XDECREF(sig_path);
    Py_XDECREF(remote_keep);
    PyMem_Free(fallback);
    if (rc != SLUICE_OK)
        return raise_code(rc, message);

    ModelObject *self = PyObject_New(ModelObject, &ModelType);
    if (!self) {
        Py_BEGIN_ALLOW_THREADS
        sluice_close(m);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    self->m = m;
    self->close_requested = 0;
    self->live = self->streams = self->in_flight = 0;
    self->close_status = SLUICE_OK;
    return (PyObject *)self;
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    int overflow = 0;
    long code = PyLong_AsLongAndOverflow(arg, &overflow);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || code < INT_MIN || code > INT_MAX)
        return PyUnicode_FromString(sluice_strerror(1));
    return PyUnicode_FromString(sluice_strerror((int)code));
}

/* algorithm_supported(name) -> bool: this build computes it. */
static PyObject *mod_algorithm_supported(PyObject *mod, PyObject *arg)
{
    const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "algorithm name must be str");
        return NULL;
    }
    for (int a = SLUICE_ALG_SHA256; a <= SLUICE_ALG_BLAKE3; a++)
        if (!strcmp(sluice_algorithm_name((sluice_algorithm)a), s))
            return PyBool_FromLong(sluice_algorithm_supported((sluice_algorithm)a));
    PyErr_Format(PyExc_ValueError, "unknown digest algorithm %R (\"sha256\" or \"blake3\")", arg);
    return NULL;
}

static PyObject *mod_dtype_bits(PyObject *mod, PyObject *arg)
{
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "dtype name must be str");
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s)
        return NULL;
    for (int d = 0; d < SLUICE_DTYPE_COUNT_; d++)
        if (!strcmp(sluice_dtype_name((sluice_dtype)d), s))
            return PyLong_FromUnsignedLong(sluice_dtype_bits((sluice_dtype)d));
    PyErr_Format(PyExc_ValueError, "unknown dtype %R", arg);
    return NULL;
}

/* ----------------------------------------------------- features, metrics */

/* features() -> dict: what this build has (CMake's findings, compiled in
 * by bindings/python/CMakeLists.txt). */
static PyObject *mod_features(PyObject *mod, PyObject *unused)
{
    int curl = 0, sqlite = 0, mhd = 0;
#ifdef SLUICE_PY_HAVE_CURL
    curl = 1;
#endif
#ifdef SLUICE_PY_HAVE_SQLITE
    sqlite = 1;
#endif
#ifdef SLUICE_PY_HAVE_MICROHTTPD
    mhd = 1;
#endif
    return Py_BuildValue("{sOsOsOsOsO}", "remote", curl ? Py_True : Py_False,
                         "s3", curl ? Py_True : Py_False, "cache", sqlite ? Py_True : Py_False,
                         "blake3", sluice_algorithm_supported(SLUICE_ALG_BLAKE3) ? Py_True
                                                                                 : Py_False,
                         "metrics_http", mhd ? Py_True : Py_False);
}

/* metrics_text(openmetrics) -> str: the model's exposition
 * (sluice_metrics_write), grown until it fits (the counters move). */
static PyObject *model_metrics_text(ModelObject *self, PyObject *arg)
{
    int om = PyObject_IsTrue(arg);
    if (om < 0 || !model_usable(self))
        return NULL;
    sluice_metrics_format f = om ? SLUICE_METRICS_OPENMETRICS : SLUICE_METRICS_PROMETHEUS;
    size_t need = 0;
    int rc = sluice_metrics_write(self->m, NULL, 0, &need, f);
    for (int tries = 0; tries < 8; tries++) {
        if (rc != SLUICE_OK && rc != SLUICE_E_BUFFER)
            return raise_model(self, rc);
        size_t cap = need + need / 4 + 4096;
        char *buf = PyMem_Malloc(cap);
        if (!buf)
            return PyErr_NoMemory();
        rc = sluice_metrics_write(self->m, buf, cap, &need, f);
        if (rc == SLUICE_OK) {
            PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
            PyMem_Free(buf);
            return r;
        }
        PyMem_Free(buf);
    }
    return raise_code(SLUICE_E_BUFFER, "the metrics kept growing while being rendered");
}

/* A sluice_metrics_server. Each model added counts as a call in flight on
 * it (in_flight), so that the library's model stays open while the server
 * may render it, even after Model.close(): the library asks for a model
 * to be removed before it is closed, and this keeps that true. */
typedef struct {
    PyObject_HEAD
    sluice_metrics_server *s; /* NULL once closed */
    PyObject *models;         /* list of the ModelObjects served */
} MetricsServerObject;

static PyTypeObject MetricsServerType;

/* serve_metrics(host, port) -> MetricsServer, listening. */
static PyObject *mod_serve_metrics(PyObject *mod, PyObject *args)
{
    const char *host;
    unsigned int port;
    if (!PyArg_ParseTuple(args, "sO&", &host, u32_arg, &port))
        return NULL;
    if (port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %u is not a TCP port (0..65535)", port);
        return NULL;
    }
    sluice_metrics_server *srv = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_metrics_serve(host, port, &srv);
    Py_END_ALLOW_THREADS
    if (rc == SLUICE_E_UNSUPPORTED)
        return raise_code(rc, "this build of the sluice package has no metrics endpoint: "
                              "it was built without libmicrohttpd (apt-get install "
                              "libmicrohttpd-dev, then reinstall the package)");
    if (rc != SLUICE_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot serve metrics on %s port %u: %s", host, port,
                 sluice_strerror(rc));
        return raise_code(rc, msg);
    }
    MetricsServerObject *self = PyObject_New(MetricsServerObject, &MetricsServerType);
    if (!self || !(self->models = PyList_New(0))) {
        if (self)
            PyObject_Free(self);
        sluice_metrics_server_free(srv);
        return PyErr_NoMemory();
    }
    self->s = srv;
    return (PyObject *)self;
}

static int metrics_server_open(MetricsServerObject *self)
{
    if (!self->s) {
        raise_code(SLUICE_E_INVAL, "the metrics server is closed");
        return 0;
    }
    return 1;
}

static PyObject *metrics_server_add(MetricsServerObject *self, PyObject *arg)
{
    if (!metrics_server_open(self))
        return NULL;
    if (!PyObject_TypeCheck(arg, &ModelType)) {
        PyErr_SetString(PyExc_TypeError, "add() takes a _sluice.Model");
        return NULL;
    }
    ModelObject *m = (ModelObject *)arg;
    int has = PySequence_Contains(self->models, arg);
    if (has < 0)
        return NULL;
    if (has)
        Py_RETURN_NONE; /* served once, as the library does */
    if (!model_usable(m))
        return NULL;
    int rc = sluice_metrics_server_add(self->s, m->m);
    if (rc == SLUICE_E_INVAL) /* the library records no detail of its own */
        return raise_code(rc, PyList_GET_SIZE(self->models) >= 64
                                  ? "the metrics server serves 64 models already"
                                  : "the metrics server already serves another model with this "
                                    "model's label (its location): each label is served once");
    if (rc != SLUICE_OK)
        return raise_code(rc, sluice_errmsg(m->m));
    if (PyList_Append(self->models, arg) < 0) {
        sluice_metrics_server_remove(self->s, m->m);
        return NULL;
    }
    m->in_flight++;
    Py_RETURN_NONE;
}

/* Stops serving models[k] and lets its deferred close happen. The GIL is
 * kept throughout: released, another thread's remove() or close() would
 * find the same entry at k and drop it twice (an IndexError left pending,
 * in_flight off by one, the server freed under this remove). The wait is
 * at most one scrape's rendering, which never takes the GIL. */
static void metrics_server_drop(MetricsServerObject *self, Py_ssize_t k)
{
    ModelObject *m = (ModelObject *)Py_NewRef(PyList_GET_ITEM(self->models, k));
    sluice_metrics_server_remove(self->s, m->m);
    if (PySequence_DelItem(self->models, k) < 0) /* k is in range: cannot fail */
        PyErr_WriteUnraisable((PyObject *)self);
    m->in_flight--;
    model_maybe_close(m);
    Py_DECREF(m);
}

static PyObject *metrics_server_remove(MetricsServerObject *self, PyObject *arg)
{
    if (!metrics_server_open(self))
        return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(self->models); k++)
        if (PyList_GET_ITEM(self->models, k) == arg) {
            metrics_server_drop(self, k);
            Py_RETURN_NONE;
        }
    return raise_code(SLUICE_E_NOT_FOUND, "the metrics server does not serve this model");
}

static void metrics_server_do_close(MetricsServerObject *self)
{
    if (!self->s)
        return;
    while (PyList_GET_SIZE(self->models) > 0)
        metrics_server_drop(self, PyList_GET_SIZE(self->models) - 1);
    sluice_metrics_server *srv = self->s;
    self->s = NULL;
    Py_BEGIN_ALLOW_THREADS
    sluice_metrics_server_free(srv);
    Py_END_ALLOW_THREADS
}

static PyObject *metrics_server_close(MetricsServerObject *self, PyObject *unused)
{
    metrics_server_do_close(self);
    Py_RETURN_NONE;
}

static void metrics_server_dealloc(MetricsServerObject *self)
{
    metrics_server_do_close(self);
    Py_XDECREF(self->models);
    PyObject_Free(self);
}

static PyObject *metrics_server_get_port(MetricsServerObject *self, void *unused)
{
    return PyLong_FromUnsignedLong(self->s ? sluice_metrics_server_port(self->s) : 0);
}

static PyObject *metrics_server_get_models(MetricsServerObject *self, void *unused)
{
    return PyList_AsTuple(self->models);
}

static PyMethodDef metrics_server_methods[] = {
    {"add", (PyCFunction)metrics_server_add, METH_O, "Serve this model's metrics too."},
    {"remove", (PyCFunction)metrics_server_remove, METH_O, "Stop serving this model."},
    {"close", (PyCFunction)metrics_server_close, METH_NOARGS, "Stop listening; idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef metrics_server_getset[] = {
    {"port", (getter)metrics_server_get_port, NULL, "the port listened on (0 once closed)", NULL},
    {"models", (getter)metrics_server_get_models, NULL, "the _sluice.Models served", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MetricsServerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._sluice.MetricsServer",
    .tp_basicsize = sizeof(MetricsServerObject),
    .tp_dealloc = (destructor)metrics_server_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An HTTP endpoint of the models' metrics (sluice_metrics_serve).",
    .tp_methods = metrics_server_methods,
    .tp_getset = metrics_server_getset,
};

/* ------------------------------------------------------------------ cache */

/* A cache directory opened for administration (sluice_cache_open), as
 * `sluice cache` uses it. The calls run without the GIL (a verify rehashes
 * every blob); busy keeps them one at a time per handle, as the library
 * asks. */
typedef struct {
    PyObject_HEAD
    sluice_cache *c; /* NULL once closed */
    int busy;
} CacheObject;

static PyTypeObject CacheType;

/* One entry copied out of a callback, for a list built after the call. */
typedef struct {
    sluice_cache_entry e; /* e.source points into source */
    char *source;
    char *why;
} CacheRow;

typedef struct {
    CacheRow *rows;
    size_t n, cap;
    int nomem;
} CacheRows;

static void cache_rows_add(CacheRows *r, const sluice_cache_entry *e, const char *why)
{
    if (r->nomem)
        return;
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        CacheRow *v = realloc(r->rows, cap * sizeof *v);
        if (!v) {
            r->nomem = 1;
            return;
        }
        r->rows = v;
        r->cap = cap;
    }
    CacheRow *row = &r->rows[r->n];
    row->e = *e;
    row->source = strdup(e->source ? e->source : "");
    row->why = why ? strdup(why) : NULL;
    if (!row->source || (why && !row->why)) {
        free(row->source);
        free(row->why);
        r->nomem = 1;
        return;
    }
    r->n++;
}

static void cache_rows_free(CacheRows *r)
{
    for (size_t k = 0; k < r->n; k++) {
        free(r->rows[k].source);
        free(r->rows[k].why);
    }
    free(r->rows);
}

static int cache_list_fn(void *user, const sluice_cache_entry *e)
{
    cache_rows_add(user, e, NULL);
    return 0;
}

static void cache_verify_fn(void *user, const sluice_cache_entry *e, const char *why)
{
    cache_rows_add(user, e, why ? why : "");
}

/* The rows as a list of tuples (algorithm, digest, bytes, source,
 * created_ns, last_access_ns, present[, why]). */
static PyObject *cache_rows_list(CacheRows *r, int with_why)
{
    if (r->nomem)
        return PyErr_NoMemory();
    PyObject *list = PyList_New((Py_ssize_t)r->n);
    for (size_t k = 0; list && k < r->n; k++) {
        const CacheRow *row = &r->rows[k];
        PyObject *src = msg_str(row->source);
        PyObject *t = !src ? NULL
                           : Py_BuildValue("(ssKNLLO)", sluice_algorithm_name(row->e.algorithm),
                                           row->e.digest, (unsigned long long)row->e.bytes, src,
                                           (long long)row->e.created_ns,
                                           (long long)row->e.last_access_ns,
                                           row->e.present ? Py_True : Py_False);
        if (t && with_why) { /* verify's rows: the same and why */
            PyObject *why = Py_BuildValue("(N)", msg_str(row->why));
            Py_SETREF(t, why ? PySequence_Concat(t, why) : NULL);
            Py_XDECREF(why);
        }
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, t);
    }
    return list;
}

static PyObject *raise_cache(CacheObject *self, int rc)
{
    if (rc == SLUICE_E_UNSUPPORTED)
        return raise_code(rc, "this build of the sluice package has no persistent cache: it "
                              "was built without SQLite (apt-get install libsqlite3-dev, then "
                              "reinstall the package)");
    return raise_code(rc, self->c ? sluice_cache_errmsg(self->c) : NULL);
}

/* Cache(dir or None) */
static PyObject *cache_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"dir", NULL};
    PyObject *dir = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&", kwlist, fs_or_none, &dir))
        return NULL;
    const char *d = dir ? PyBytes_AS_STRING(dir) : NULL;
    sluice_cache *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_cache_open(d, &c);
    Py_END_ALLOW_THREADS
    Py_XDECREF(dir);
    CacheObject *self = (CacheObject *)type->tp_alloc(type, 0);
    if (!self) {
        sluice_cache_close(c);
        return NULL;
    }
    self->c = c;
    self->busy = 0;
    if (rc != SLUICE_OK || !c) {
        raise_cache(self, c ? rc : SLUICE_E_NOMEM);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int cache_begin(CacheObject *self)
{
    if (!self->c) {
        raise_code(SLUICE_E_INVAL, "the cache is closed");
        return 0;
    }
    if (self->busy) {
        raise_code(SLUICE_E_BUSY, "the cache handle is in use by another thread");
        return 0;
    }
    self->busy = 1;
    return 1;
}

/* ls() -> [(algorithm, digest, bytes, source, created_ns, last_access_ns,
 * present)], least recently used first. */
static PyObject *cache_ls(CacheObject *self, PyObject *unused)
{
    if (!cache_begin(self))
        return NULL;
    CacheRows rows = {0};
    int rc;
    sluice_cache *c = self->c;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_cache_list(c, cache_list_fn, &rows);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyObject *r = rc == SLUICE_OK ? cache_rows_list(&rows, 0) : raise_cache(self, rc);
    cache_rows_free(&rows);
    return r;
}

/* du() -> (bytes, entries) */
static PyObject *cache_du(CacheObject *self, PyObject *unused)
{
    if (!cache_begin(self))
        return NULL;
    uint64_t bytes = 0, entries = 0;
    int rc;
    sluice_cache *c = self->c;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_cache_usage(c, &bytes, &entries);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc != SLUICE_OK)
        return raise_cache(self, rc);
    return Py_BuildValue("(KK)", (unsigned long long)bytes, (unsigned long long)entries);
}

/* gc(max_bytes) / clear() -> (freed_bytes, freed_entries) */
static PyObject *cache_gc_or_clear(CacheObject *self, int clear, uint64_t max_bytes)
{
    if (!cache_begin(self))
        return NULL;
    uint64_t fb = 0, fe = 0;
    int rc;
    sluice_cache *c = self->c;
    Py_BEGIN_ALLOW_THREADS
    rc = clear ? sluice_cache_clear(c, &fb, &fe) : sluice_cache_gc(c, max_bytes, &fb, &fe);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc != SLUICE_OK)
        return raise_cache(self, rc);
    return Py_BuildValue("(KK)", (unsigned long long)fb, (unsigned long long)fe);
}

static PyObject *cache_gc(CacheObject *self, PyObject *arg)
{
    unsigned long long max_bytes;
    if (!u64_arg(arg, &max_bytes))
        return NULL;
    return cache_gc_or_clear(self, 0, max_bytes);
}

static PyObject *cache_clear(CacheObject *self, PyObject *unused)
{
    return cache_gc_or_clear(self, 1, 0);
}

/* verify() -> (checked, dropped, [(algorithm, digest, bytes, source,
 * created_ns, last_access_ns, present, why)]) */
static PyObject *cache_verify(CacheObject *self, PyObject *unused)
{
    if (!cache_begin(self))
        return NULL;
    CacheRows rows = {0};
    uint64_t checked = 0, dropped = 0;
    int rc;
    sluice_cache *c = self->c;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_cache_verify(c, &checked, &dropped, cache_verify_fn, &rows);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyObject *list = rc == SLUICE_OK ? cache_rows_list(&rows, 1) : raise_cache(self, rc);
    cache_rows_free(&rows);
    if (!list)
        return NULL;
    return Py_BuildValue("(KKN)", (unsigned long long)checked, (unsigned long long)dropped, list);
}

static PyObject *cache_close(CacheObject *self, PyObject *unused)
{
    if (self->busy)
        return raise_code(SLUICE_E_BUSY, "the cache handle is in use by another thread");
    sluice_cache_close(self->c);
    self->c = NULL;
    Py_RETURN_NONE;
}

static void cache_dealloc(CacheObject *self)
{
    sluice_cache_close(self->c); /* busy is 0: a call holds a reference */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cache_get_path(CacheObject *self, void *unused)
{
    if (!self->c)
        Py_RETURN_NONE;
    return path_str(sluice_cache_path(self->c));
}

static PyMethodDef cache_methods[] = {
    {"ls", (PyCFunction)cache_ls, METH_NOARGS, "Every entry, least recently used first."},
    {"du", (PyCFunction)cache_du, METH_NOARGS, "(bytes, entries) recorded."},
    {"gc", (PyCFunction)cache_gc, METH_O, "Evict down to max_bytes: (freed_bytes, freed_entries)."},
    {"clear", (PyCFunction)cache_clear, METH_NOARGS, "Delete everything: (freed_bytes, freed_entries)."},
    {"verify", (PyCFunction)cache_verify, METH_NOARGS, "Rehash every blob: (checked, dropped, rows)."},
    {"close", (PyCFunction)cache_close, METH_NOARGS, "Free the handle."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cache_getset[] = {
    {"path", (getter)cache_get_path, NULL, "the cache directory", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._sluice.Cache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A cache directory opened for administration (sluice_cache_open).",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
    .tp_new = cache_new,
};

#ifdef SLUICE_PY_TEST_HOOKS
/* _fail_next_close(code): the next close of a library model, by any Model,
 * fails with code and leaves the model open. Tests only. */
static PyObject *mod_fail_next_close(PyObject *mod, PyObject *arg)
{
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    test_close_fault = code;
    Py_RETURN_NONE;
}
#endif

/* manifest_sign(manifest, key, sig or None): sluice_manifest_sign (GIL
 * released). */
static PyObject *mod_manifest_sign(PyObject *mod, PyObject *args)
{
    PyObject *mpath = NULL, *kpath = NULL, *spath = NULL, *sig_obj = Py_None;
    if (!PyArg_ParseTuple(args, "O&O&|O", PyUnicode_FSConverter, &mpath, PyUnicode_FSConverter,
                          &kpath, &sig_obj)) {
        Py_XDECREF(mpath);
        return NULL;
    }
    if (sig_obj != Py_None && !PyUnicode_FSConverter(sig_obj, &spath)) {
        Py_DECREF(mpath);
        Py_DECREF(kpath);
        return NULL;
    }
    const char *m = PyBytes_AS_STRING(mpath), *k = PyBytes_AS_STRING(kpath),
               *sp = spath ? PyBytes_AS_STRING(spath) : NULL;
    char why[1024];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sluice_manifest_sign(m, k, sp, why, sizeof why);
    Py_END_ALLOW_THREADS
    Py_DECREF(mpath);
    Py_DECREF(kpath);
    Py_XDECREF(spath);
    return rc == SLUICE_OK ? Py_NewRef(Py_None) : raise_code(rc, why);
}

static PyMethodDef module_methods[] = {
#ifdef SLUICE_PY_TEST_HOOKS
    {"_fail_next_close", (PyCFunction)mod_fail_next_close, METH_O,
     "Tests only: the next close fails with this code."},
#endif
    {"open", (PyCFunction)(void (*)(void))mod_open, METH_VARARGS | METH_KEYWORDS,
     "Open a model (see sluice.open)."},
    {"strerror", (PyCFunction)mod_strerror, METH_O, "Name of a status code."},
    {"manifest_sign", (PyCFunction)mod_manifest_sign, METH_VARARGS,
     "manifest_sign(manifest, key, sig=None): sluice_manifest_sign."},
    {"features", (PyCFunction)mod_features, METH_NOARGS, "What this build has."},
    {"serve_metrics", (PyCFunction)mod_serve_metrics, METH_VARARGS,
     "serve_metrics(host, port) -> MetricsServer (sluice_metrics_serve)."},
    {"dtype_bits", (PyCFunction)mod_dtype_bits, METH_O, "Bits per element of a dtype name."},
    {"part_dims", (PyCFunction)mod_part_dims, METH_VARARGS,
     "The dim the rules split each (name, ndim) along, -1 replicated."},
    {"algorithm_supported", (PyCFunction)mod_algorithm_supported, METH_O,
     "Whether this build computes a digest algorithm."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sluice._sluice",
    "The C layer of the sluice package; use the sluice module.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sluice(void)
{
    if (PyType_Ready(&ModelType) < 0 || PyType_Ready(&HandleType) < 0 ||
        PyType_Ready(&StreamType) < 0 || PyType_Ready(&MetricsServerType) < 0 ||
        PyType_Ready(&CacheType) < 0)
        return NULL;
    PyObject *errors = PyImport_ImportModule("sluice._errors");
    if (!errors)
        return NULL;
    make_error_fn = PyObject_GetAttrString(errors, "make_error");
    Py_DECREF(errors);
    if (!make_error_fn)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Model", (PyObject *)&ModelType) < 0 ||
        PyModule_AddObjectRef(m, "Handle", (PyObject *)&HandleType) < 0 ||
        PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0 ||
        PyModule_AddObjectRef(m, "MetricsServer", (PyObject *)&MetricsServerType) < 0 ||
        PyModule_AddObjectRef(m, "Cache", (PyObject *)&CacheType) < 0 ||
        PyModule_AddStringConstant(m, "library_version", sluice_version()) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_QUEUE", STREAM_QUEUE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
