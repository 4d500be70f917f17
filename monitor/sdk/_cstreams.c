/* @track on generators and async generators, in C.
 *
 * What monitor/sdk/_streams.py does in Python, for the calls whose text is not sampled: a
 * stream is one call, its items its output tokens; the first item's clock read is the time to
 * first token; at the end one record `start, first, end, items` goes to the label set's
 * `streamed` buffer (four list appends, no lock: see collectors/_recording.py) and, once in
 * `mask + 1` calls, the buffers are folded. A Python wrapper of that kind (a generator or an
 * async generator) costs about half a bare prometheus pair by itself, before it tracks
 * anything (docs/benchmarks/ingest.md); these types cost a few allocations.
 *
 * `Tracked` is the decorated function: a callable whose `__get__` binds it like a function
 * and whose `__dict__` takes what functools.wraps copies, plus the wrapped function's
 * `__code__`, so that inspect still calls it a generator function. A call decides sampling,
 * creates the user's generator and returns a `Stream` (sync) or `AStream` (async) around it.
 * The stream enters the label set and reads the start at its first step, as the Python
 * generator would; a sampled one then hands itself over (below) with the call's arguments,
 * whose prompt the Python loop keeps with the items.
 *
 * The rest is Python's, handed over with the stream's state: a value sent to a generator that
 * uses what is sent, and anything thrown, continue in `_streams._drive` / `_streams._adrive`
 * (the `handover` callable), which the stream then forwards to. A closed stream, or one
 * dropped before its end, is recorded as finished without an error; an exception from the
 * generator with its type's name (`record`). The SDK's own failures are counted
 * (`internal(stage)`) and never raised into the user's stream.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

enum { NEW, RUNNING, DELEGATED, DONE };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;           /* the user's generator function */
    PyObject *host;         /* the Tracker: .rate */
    PyObject *monitor;      /* .config.sample_rate when the tracker's rate is None */
    PyObject *clock;
    PyObject *entered;      /* series.entered.incr */
    PyObject *streamed;     /* series.streamed, a list */
    PyObject *fold;         /* series.fold */
    PyObject *rand;         /* random.random */
    PyObject *internal;     /* host.internal(stage) */
    PyObject *sampled;      /* (gen, start, args, kwargs) -> the Python loop that keeps the text */
    PyObject *handover;     /* (gen, start, n, first, sent, thrown, None, None) -> generator */
    PyObject *record;       /* (start, first, n, error_type) */
    PyObject *await_throw;  /* the sentinel `thrown` that makes `handover` wait for a throw */
    PyObject *dict;
    PyObject *weakrefs;
    unsigned long long mask;
    int is_async;
    int passthrough;        /* the generator drops what is sent to it */
} Tracked;

typedef struct {
    PyObject_HEAD
    Tracked *t;
    PyObject *gen;          /* the user's generator (or async generator) */
    PyObject *delegate;     /* after a handover: the Python generator; untracked: gen */
    PyObject *args;         /* a sampled call's arguments, until its first step */
    PyObject *kwargs;
    double start, first;
    Py_ssize_t n;
    unsigned long long k;
    int state;
} Stream;

typedef struct {
    PyObject_HEAD
    Stream *s;
    PyObject *inner;        /* the awaitable of the user's generator's next step */
} Step;

static PyTypeObject Tracked_Type, Stream_Type, AStream_Type, Step_Type;
static PyObject *str_rate, *str_config, *str_sample_rate, *str_start, *str_token, *str_finish;
static PyObject *str_send, *str_throw, *str_close, *str_asend, *str_athrow, *str_aclose, *str_name;

/* -- the SDK's side: none of these leaves an exception set ---------------------------------- */

static void
internal(Tracked *t, PyObject *stage)
{
    PyObject *r = PyObject_CallOneArg(t->internal, stage);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
}

static int
read_clock(Tracked *t, double *out)
{
    PyObject *v = PyObject_CallNoArgs(t->clock);
    if (v == NULL)
        return -1;
    double d = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (d == -1.0 && PyErr_Occurred())
        return -1;
    *out = d;
    return 0;
}

/* 1: sample this call's text, 0: not, -1: the SDK failed (an exception is set) */
static int
decide(Tracked *t)
{
    PyObject *rate = PyObject_GetAttr(t->host, str_rate);
    if (rate == NULL)
        return -1;
    if (rate == Py_None) {
        Py_DECREF(rate);
        PyObject *config = PyObject_GetAttr(t->monitor, str_config);
        if (config == NULL)
            return -1;
        rate = PyObject_GetAttr(config, str_sample_rate);
        Py_DECREF(config);
        if (rate == NULL)
            return -1;
    }
    double r = PyFloat_AsDouble(rate);
    Py_DECREF(rate);
    if (r == -1.0 && PyErr_Occurred())
        return -1;
    if (r == 0.0)
        return 0;
    if (r >= 1.0)
        return 1;
    PyObject *u = PyObject_CallNoArgs(t->rand);
    if (u == NULL)
        return -1;
    double x = PyFloat_AsDouble(u);
    Py_DECREF(u);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    return x < r;
}

/* record(start, first, n, error_type) through Python (an empty stream, a close, an error) */
static void
record(Stream *s, PyObject *error_type)
{
    PyObject *argv[4] = {NULL, NULL, NULL, error_type};
    argv[0] = PyFloat_FromDouble(s->start);
    argv[1] = PyFloat_FromDouble(s->first);
    argv[2] = PyLong_FromSsize_t(s->n);
    PyObject *r = NULL;
    if (argv[0] && argv[1] && argv[2])
        r = PyObject_Vectorcall(s->t->record, argv, 4, NULL);
    Py_XDECREF(argv[0]);
    Py_XDECREF(argv[1]);
    Py_XDECREF(argv[2]);
    if (r == NULL) {
        PyErr_Clear();
        internal(s->t, str_finish);
    }
    Py_XDECREF(r);
}

/* The stream raised (the exception is set and stays set): recorded with its type's name. */
static void
record_error(Stream *s)
{
    PyObject *type, *value, *tb;
    s->state = DONE;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *name = type ? PyObject_GetAttr(type, str_name) : NULL;
    if (name == NULL)
        PyErr_Clear();
    record(s, name ? name : Py_None);
    Py_XDECREF(name);
    PyErr_Restore(type, value, tb);
}

/* The stream ended (no exception set; any set by the caller is kept). */
static void
record_end(Stream *s)
{
    Tracked *t = s->t;
    s->state = DONE;
    if (s->n == 0) {
        record(s, Py_None);
        return;
    }
    double end;
    if (read_clock(t, &end) < 0)
        goto failed;
    PyObject *fields[4] = {
        PyFloat_FromDouble(s->start), PyFloat_FromDouble(s->first), PyFloat_FromDouble(end),
        PyLong_FromSsize_t(s->n),
    };
    int ok = fields[0] && fields[1] && fields[2] && fields[3];
    for (int i = 0; i < 4 && ok; i++)  /* floats and ints are not tracked: no collection between */
        ok = PyList_Append(t->streamed, fields[i]) == 0;
    for (int i = 0; i < 4; i++)
        Py_XDECREF(fields[i]);
    if (!ok)
        goto failed;
    if ((s->k & t->mask) == t->mask) {
        PyObject *r = PyObject_CallNoArgs(t->fold);
        if (r == NULL)
            goto failed;
        Py_DECREF(r);
    }
    return;
failed:
    PyErr_Clear();
    internal(t, str_finish);
}

static void
first_item(Stream *s)
{
    if (s->n++ == 0 && read_clock(s->t, &s->first) < 0) {
        PyErr_Clear();
        internal(s->t, str_token);
    }
}

/* The first step: enter the label set and read the start; on the SDK's failure the stream
 * goes on untracked (the delegate is the user's generator). */
static void
begin(Stream *s)
{
    Tracked *t = s->t;
    PyObject *k = NULL;
    if (read_clock(t, &s->start) < 0 || (k = PyObject_CallNoArgs(t->entered)) == NULL)
        goto failed;
    s->k = PyLong_AsUnsignedLongLongMask(k);
    Py_DECREF(k);
    if (PyErr_Occurred())
        goto failed;
    s->state = RUNNING;
    if (s->args != NULL) {  /* sampled: the Python loop from here */
        PyObject *argv[4] = {s->gen, PyFloat_FromDouble(s->start), s->args, s->kwargs};
        PyObject *d = argv[1] ? PyObject_Vectorcall(t->sampled, argv, 4, NULL) : NULL;
        Py_XDECREF(argv[1]);
        Py_CLEAR(s->args);
        Py_CLEAR(s->kwargs);
        if (d == NULL) {  /* entered: recorded as finished, then untracked */
            PyErr_Clear();
            record(s, Py_None);
            goto failed;
        }
        s->state = DELEGATED;
        s->delegate = d;
    }
    return;
failed:
    PyErr_Clear();
    internal(t, str_start);
    Py_CLEAR(s->args);
    Py_CLEAR(s->kwargs);
    s->state = DELEGATED;
    Py_INCREF(s->gen);
    s->delegate = s->gen;
}

/* Hand the stream over to Python's general loop, at `sent` (a value sent) or waiting for a
 * throw (`thrown` the sentinel); -1 with an exception set if that failed. */
static int
hand_over(Stream *s, PyObject *sent, PyObject *thrown)
{
    Tracked *t = s->t;
    PyObject *argv[8] = {s->gen, NULL, NULL, NULL, sent, thrown, Py_None, Py_None};
    argv[1] = PyFloat_FromDouble(s->start);
    argv[2] = PyLong_FromSsize_t(s->n);
    argv[3] = PyFloat_FromDouble(s->first);
    PyObject *d = NULL;
    if (argv[1] && argv[2] && argv[3])
        d = PyObject_Vectorcall(t->handover, argv, 8, NULL);
    Py_XDECREF(argv[1]);
    Py_XDECREF(argv[2]);
    Py_XDECREF(argv[3]);
    if (d == NULL)
        return -1;
    s->state = DELEGATED;
    s->delegate = d;
    return 0;
}

static PyObject *
call_method(PyObject *obj, PyObject *name, PyObject *args)
{
    PyObject *m = PyObject_GetAttr(obj, name);
    if (m == NULL)
        return NULL;
    PyObject *r = PyObject_Call(m, args, NULL);
    Py_DECREF(m);
    return r;
}

/* -- Tracked: the decorated function ----------------------------------------------------------- */

static PyObject *Stream_new(Tracked *t, PyObject *gen, PyTypeObject *type);

/* A sampled call's arguments as a tuple and a dict, for its prompt. */
static int
keep_arguments(Stream *s, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    s->args = PyTuple_New(n);
    s->kwargs = PyDict_New();
    if (s->args == NULL || s->kwargs == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(s->args, i, args[i]);
    }
    for (Py_ssize_t i = 0; i < nk; i++)
        if (PyDict_SetItem(s->kwargs, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0)
            return -1;
    return 0;
}

static PyObject *
Tracked_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Tracked *t = (Tracked *)self;
    int sampled = decide(t);
    if (sampled < 0) {  /* the SDK failed: the user's generator, untracked */
        PyErr_Clear();
        internal(t, str_start);
        return PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
    }
    PyObject *gen = PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
    if (gen == NULL) {  /* bad arguments: raised here, as the bare function raises them */
        Stream s = {.t = t, .state = RUNNING};
        PyObject *type, *value, *tb, *k = NULL;
        PyErr_Fetch(&type, &value, &tb);
        if (read_clock(t, &s.start) < 0 || (k = PyObject_CallNoArgs(t->entered)) == NULL) {
            PyErr_Clear();
            internal(t, str_start);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        Py_DECREF(k);
        PyErr_Restore(type, value, tb);
        record_error(&s);
        return NULL;
    }
    int usable = t->is_async ? Py_TYPE(gen)->tp_as_async != NULL && Py_TYPE(gen)->tp_as_async->am_anext != NULL
                             : PyIter_Check(gen);
    if (!usable) {  /* not a generator after all: the user's object, untracked */
        internal(t, str_start);
        return gen;
    }
    PyObject *stream = Stream_new(t, gen, t->is_async ? &AStream_Type : &Stream_Type);
    Py_DECREF(gen);
    if (stream != NULL && sampled && keep_arguments((Stream *)stream, args, nargsf, kwnames) < 0)
        Py_CLEAR(stream);
    return stream;
}

static PyObject *
Tracked_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *f[13];
    unsigned long long mask;
    int is_async, passthrough;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOKpp:Tracked", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                          &f[6], &f[7], &f[8], &f[9], &f[10], &f[11], &f[12], &mask, &is_async,
                          &passthrough))
        return NULL;
    if (!PyList_Check(f[5])) {
        PyErr_SetString(PyExc_TypeError, "Tracked: streamed must be a list");
        return NULL;
    }
    Tracked *t = (Tracked *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    PyObject **fields[13] = {&t->fn, &t->host, &t->monitor, &t->clock, &t->entered, &t->streamed,
                             &t->fold, &t->rand, &t->internal, &t->sampled, &t->handover,
                             &t->record, &t->await_throw};
    for (int i = 0; i < 13; i++) {
        Py_INCREF(f[i]);
        *fields[i] = f[i];
    }
    t->mask = mask;
    t->is_async = is_async;
    t->passthrough = passthrough;
    t->vectorcall = Tracked_vectorcall;
    return (PyObject *)t;
}

static int
Tracked_traverse(Tracked *t, visitproc visit, void *arg)
{
    Py_VISIT(t->fn);
    Py_VISIT(t->host);
    Py_VISIT(t->monitor);
    Py_VISIT(t->clock);
    Py_VISIT(t->entered);
    Py_VISIT(t->streamed);
    Py_VISIT(t->fold);
    Py_VISIT(t->rand);
    Py_VISIT(t->internal);
    Py_VISIT(t->sampled);
    Py_VISIT(t->handover);
    Py_VISIT(t->record);
    Py_VISIT(t->await_throw);
    Py_VISIT(t->dict);
    return 0;
}

static int
Tracked_clear(Tracked *t)
{
    Py_CLEAR(t->fn);
    Py_CLEAR(t->host);
    Py_CLEAR(t->monitor);
    Py_CLEAR(t->clock);
    Py_CLEAR(t->entered);
    Py_CLEAR(t->streamed);
    Py_CLEAR(t->fold);
    Py_CLEAR(t->rand);
    Py_CLEAR(t->internal);
    Py_CLEAR(t->sampled);
    Py_CLEAR(t->handover);
    Py_CLEAR(t->record);
    Py_CLEAR(t->await_throw);
    Py_CLEAR(t->dict);
    return 0;
}

static void
Tracked_dealloc(Tracked *t)
{
    PyObject_GC_UnTrack(t);
    if (t->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)t);
    Tracked_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *
Tracked_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *
Tracked_repr(Tracked *t)
{
    return PyUnicode_FromFormat("<tracked %R>", t->fn);
}

/* pickled by reference, as functions are: the module's global of that qualified name */
static PyObject *
Tracked_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef Tracked_methods[] = {
    {"__reduce__", Tracked_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef Tracked_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject Tracked_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infersight.monitor.sdk._cstreams.Tracked",
    .tp_doc = "A generator function (or async generator function) under @track.",
    .tp_basicsize = sizeof(Tracked),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = Tracked_new,
    .tp_dealloc = (destructor)Tracked_dealloc,
    .tp_traverse = (traverseproc)Tracked_traverse,
    .tp_clear = (inquiry)Tracked_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Tracked, vectorcall),
    .tp_descr_get = Tracked_get,
    .tp_dictoffset = offsetof(Tracked, dict),
    .tp_weaklistoffset = offsetof(Tracked, weakrefs),
    .tp_repr = (reprfunc)Tracked_repr,
    .tp_getset = Tracked_getset,
    .tp_methods = Tracked_methods,
};

/* -- Stream and AStream: shared state ------------------------------------------------------------ */

static PyObject *
Stream_new(Tracked *t, PyObject *gen, PyTypeObject *type)
{
    Stream *s = PyObject_GC_New(Stream, type);
    if (s == NULL)
        return NULL;
    Py_INCREF(t);
    Py_INCREF(gen);
    s->t = t;
    s->gen = gen;
    s->delegate = s->args = s->kwargs = NULL;
    s->start = s->first = 0.0;
    s->n = 0;
    s->k = 0;
    s->state = NEW;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static int
Stream_traverse(Stream *s, visitproc visit, void *arg)
{
    Py_VISIT(s->t);
    Py_VISIT(s->gen);
    Py_VISIT(s->delegate);
    Py_VISIT(s->args);
    Py_VISIT(s->kwargs);
    return 0;
}

static int
Stream_clear(Stream *s)
{
    Py_CLEAR(s->t);
    Py_CLEAR(s->gen);
    Py_CLEAR(s->delegate);
    Py_CLEAR(s->args);
    Py_CLEAR(s->kwargs);
    return 0;
}

/* Dropped before its end: finished without an error, as a closed stream is. */
static void
Stream_finalize(Stream *s)
{
    if (s->state != RUNNING || s->t == NULL)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    s->state = DONE;
    record(s, Py_None);
    PyErr_Restore(type, value, tb);
}

static void
Stream_dealloc(Stream *s)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)s) < 0)
        return;  /* resurrected */
    PyObject_GC_UnTrack(s);
    Stream_clear(s);
    PyObject_GC_Del(s);
}

/* -- Stream: a generator ---------------------------------------------------------------------- */

static PyObject *
Stream_next(Stream *s)
{
    if (s->state == NEW)
        begin(s);
    if (s->state == DELEGATED)
        return Py_TYPE(s->delegate)->tp_iternext(s->delegate);
    if (s->state == DONE)
        return NULL;
    PyObject *v = Py_TYPE(s->gen)->tp_iternext(s->gen);
    if (v != NULL) {
        first_item(s);
        return v;
    }
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_StopIteration)) {
        record_error(s);
        return NULL;
    }
    PyObject *type, *value, *tb;  /* a return value rides on the StopIteration: kept */
    PyErr_Fetch(&type, &value, &tb);
    record_end(s);
    PyErr_Restore(type, value, tb);
    return NULL;
}

static PyObject *
stop_iteration(PyObject *value)  /* send(): StopIteration carrying `value` (stolen) */
{
    if (value == Py_None)
        PyErr_SetNone(PyExc_StopIteration);
    else {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, value);
        if (e != NULL) {
            PyErr_SetObject(PyExc_StopIteration, e);
            Py_DECREF(e);
        }
    }
    Py_DECREF(value);
    return NULL;
}

static PyObject *
Stream_send(Stream *s, PyObject *value)
{
    if (s->state == DELEGATED) {
        PyObject *r;
        switch (PyIter_Send(s->delegate, value, &r)) {
        case PYGEN_NEXT: return r;
        case PYGEN_RETURN: return stop_iteration(r);
        default: return NULL;
        }
    }
    if (value != Py_None && s->state == NEW) {
        PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started generator");
        return NULL;
    }
    if (value != Py_None && s->state == RUNNING && !s->t->passthrough) {
        if (hand_over(s, value, Py_None) < 0)
            return NULL;  /* the SDK failed where it could not go on: as Python would raise */
        PyObject *v = Py_TYPE(s->delegate)->tp_iternext(s->delegate);
        if (v == NULL && !PyErr_Occurred())
            PyErr_SetNone(PyExc_StopIteration);
        return v;
    }
    PyObject *v = Stream_next(s);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetNone(PyExc_StopIteration);
    return v;
}

static PyObject *
Stream_throw(Stream *s, PyObject *args)
{
    if (s->state == NEW) {  /* never started: nothing entered; the generator raises it */
        s->state = DONE;
        return call_method(s->gen, str_throw, args);
    }
    if (s->state == DONE)
        return call_method(s->gen, str_throw, args);
    if (s->state == RUNNING) {
        if (hand_over(s, Py_None, s->t->await_throw) < 0)
            return NULL;
        PyObject *primed = Py_TYPE(s->delegate)->tp_iternext(s->delegate);
        if (primed == NULL)
            return NULL;
        Py_DECREF(primed);
    }
    return call_method(s->delegate, str_throw, args);
}

static PyObject *
Stream_close(Stream *s, PyObject *Py_UNUSED(ignored))
{
    if (s->state == DELEGATED)
        return PyObject_CallMethodNoArgs(s->delegate, str_close);
    if (s->state == RUNNING)
        record(s, Py_None);
    s->state = DONE;
    return PyObject_CallMethodNoArgs(s->gen, str_close);
}

static PyObject *
self_iter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static PyMethodDef Stream_methods[] = {
    {"send", (PyCFunction)Stream_send, METH_O, "send(value): next(), or the generator's send."},
    {"throw", (PyCFunction)Stream_throw, METH_VARARGS, "throw(exc): into the generator."},
    {"close", (PyCFunction)Stream_close, METH_NOARGS, "close(): the call ends without an error."},
    {NULL},
};

static PyTypeObject Stream_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infersight.monitor.sdk._cstreams.Stream",
    .tp_doc = "A tracked generator's stream (a collections.abc.Generator).",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_finalize = (destructor)Stream_finalize,
    .tp_traverse = (traverseproc)Stream_traverse,
    .tp_clear = (inquiry)Stream_clear,
    .tp_iter = self_iter,
    .tp_iternext = (iternextfunc)Stream_next,
    .tp_methods = Stream_methods,
};

/* -- AStream: an async generator; Step: the awaitable of one of its steps ---------------------------- */

static PyObject *
Step_new(Stream *s, PyObject *inner)  /* steals inner */
{
    Step *st = PyObject_New(Step, &Step_Type);
    if (st == NULL) {
        Py_DECREF(inner);
        return NULL;
    }
    Py_INCREF(s);
    st->s = s;
    st->inner = inner;
    return (PyObject *)st;
}

static void
Step_dealloc(Step *st)
{
    Py_CLEAR(st->s);
    Py_CLEAR(st->inner);
    PyObject_Free(st);
}

/* One step's outcome: an item (PYGEN_RETURN), the stream's end or an error (PYGEN_ERROR). */
static PySendResult
Step_outcome(Step *st, PySendResult r)
{
    Stream *s = st->s;
    if (s->state != RUNNING || r == PYGEN_NEXT)
        return r;
    if (r == PYGEN_RETURN) {
        first_item(s);
        return r;
    }
    if (PyErr_ExceptionMatches(PyExc_StopAsyncIteration)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        record_end(s);
        PyErr_Restore(type, value, tb);
    } else
        record_error(s);
    return PYGEN_ERROR;
}

static PySendResult
Step_am_send(Step *st, PyObject *arg, PyObject **result)
{
    return Step_outcome(st, PyIter_Send(st->inner, arg, result));
}

static PyObject *
Step_result(PySendResult r, PyObject *value)  /* as __next__/send/throw give it */
{
    if (r == PYGEN_NEXT)
        return value;
    if (r == PYGEN_RETURN)
        return stop_iteration(value);
    return NULL;
}

static PyObject *
Step_next(Step *st)
{
    PyObject *v = NULL;
    PySendResult r = Step_am_send(st, Py_None, &v);
    return Step_result(r, v);
}

static PyObject *
Step_send(Step *st, PyObject *arg)
{
    PyObject *v = NULL;
    PySendResult r = Step_am_send(st, arg, &v);
    return Step_result(r, v);
}

static PyObject *
Step_throw(Step *st, PyObject *args)
{
    PyObject *v = call_method(st->inner, str_throw, args);
    if (v != NULL)
        return v;  /* the generator caught it and awaits again */
    PySendResult r = PYGEN_ERROR;
    if (PyErr_ExceptionMatches(PyExc_StopIteration)) {  /* ... or yielded an item */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        v = value ? PyObject_GetAttrString(value, "value") : NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (v == NULL)
            return NULL;
        r = PYGEN_RETURN;
    }
    return Step_result(Step_outcome(st, r), v);
}

static PyObject *
Step_close(Step *st, PyObject *Py_UNUSED(ignored))
{
    return PyObject_CallMethodNoArgs(st->inner, str_close);
}

static PyMethodDef Step_methods[] = {
    {"send", (PyCFunction)Step_send, METH_O, NULL},
    {"throw", (PyCFunction)Step_throw, METH_VARARGS, NULL},
    {"close", (PyCFunction)Step_close, METH_NOARGS, NULL},
    {NULL},
};

static PyAsyncMethods Step_async = {
    .am_await = self_iter,
    .am_send = (sendfunc)Step_am_send,
};

static PyTypeObject Step_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infersight.monitor.sdk._cstreams.Step",
    .tp_doc = "The awaitable of one step of a tracked async generator.",
    .tp_basicsize = sizeof(Step),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Step_dealloc,
    .tp_as_async = &Step_async,
    .tp_iter = self_iter,
    .tp_iternext = (iternextfunc)Step_next,
    .tp_methods = Step_methods,
};

static PyObject *
AStream_anext(Stream *s)
{
    if (s->state == NEW)
        begin(s);
    PyObject *target = s->state == DELEGATED ? s->delegate : s->gen;
    PyAsyncMethods *am = Py_TYPE(target)->tp_as_async;
    if (am == NULL || am->am_anext == NULL)
        return PyErr_Format(PyExc_TypeError, "'%.100s' is not an async iterator", Py_TYPE(target)->tp_name);
    PyObject *inner = am->am_anext(target);
    if (inner == NULL || s->state != RUNNING)
        return inner;
    return Step_new(s, inner);
}

static PyObject *
AStream_asend(Stream *s, PyObject *value)
{
    if (s->state == DELEGATED || s->state == DONE || (value != Py_None && s->state == NEW))
        return PyObject_CallMethodOneArg(s->state == DELEGATED ? s->delegate : s->gen, str_asend, value);
    if (value != Py_None && s->state == RUNNING && !s->t->passthrough) {
        if (hand_over(s, value, Py_None) < 0)
            return NULL;
        return PyObject_CallMethodOneArg(s->delegate, str_asend, Py_None);
    }
    return AStream_anext(s);  /* what is sent is dropped, as the generator drops it */
}

static PyObject *
AStream_athrow(Stream *s, PyObject *args)
{
    if (s->state == NEW || s->state == DONE) {  /* never started: nothing entered */
        s->state = DONE;
        return call_method(s->gen, str_athrow, args);
    }
    if (s->state == RUNNING) {
        if (hand_over(s, Py_None, s->t->await_throw) < 0)
            return NULL;
        /* prime it: its first step reaches the `yield` that waits for the throw, awaiting nothing */
        PyObject *aw = AStream_anext(s), *v;  /* the delegate's first step */
        if (aw == NULL)
            return NULL;
        PySendResult r = PyIter_Send(aw, Py_None, &v);
        Py_DECREF(aw);
        if (r == PYGEN_ERROR)
            return NULL;
        Py_DECREF(v);
    }
    return call_method(s->delegate, str_athrow, args);
}

static PyObject *
AStream_aclose(Stream *s, PyObject *Py_UNUSED(ignored))
{
    if (s->state == DELEGATED)
        return PyObject_CallMethodNoArgs(s->delegate, str_aclose);
    if (s->state == RUNNING)
        record(s, Py_None);
    s->state = DONE;
    return PyObject_CallMethodNoArgs(s->gen, str_aclose);
}

static PyMethodDef AStream_methods[] = {
    {"asend", (PyCFunction)AStream_asend, METH_O, "asend(value): the next step."},
    {"athrow", (PyCFunction)AStream_athrow, METH_VARARGS, "athrow(exc): into the generator."},
    {"aclose", (PyCFunction)AStream_aclose, METH_NOARGS, "aclose(): the call ends without an error."},
    {NULL},
};

static PyAsyncMethods AStream_async = {
    .am_aiter = self_iter,
    .am_anext = (unaryfunc)AStream_anext,
};

static PyTypeObject AStream_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "infersight.monitor.sdk._cstreams.AStream",
    .tp_doc = "A tracked async generator's stream (a collections.abc.AsyncGenerator).",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_finalize = (destructor)Stream_finalize,
    .tp_traverse = (traverseproc)Stream_traverse,
    .tp_clear = (inquiry)Stream_clear,
    .tp_as_async = &AStream_async,
    .tp_methods = AStream_methods,
};

/* -- the module ------------------------------------------------------------------------------------ */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "infersight.monitor.sdk._cstreams",
    .m_doc = "@track's generator and async-generator streams in C (see _streams.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__cstreams(void)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&str_rate, "rate"}, {&str_config, "config"}, {&str_sample_rate, "sample_rate"},
        {&str_start, "start"}, {&str_token, "token"}, {&str_finish, "finish"},
        {&str_send, "send"}, {&str_throw, "throw"}, {&str_close, "close"}, {&str_asend, "asend"},
        {&str_athrow, "athrow"}, {&str_aclose, "aclose"}, {&str_name, "__name__"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    PyTypeObject *types[] = {&Tracked_Type, &Stream_Type, &AStream_Type, &Step_Type};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Tracked", (PyObject *)&Tracked_Type) < 0
        || PyModule_AddObjectRef(m, "Stream", (PyObject *)&Stream_Type) < 0
        || PyModule_AddObjectRef(m, "AStream", (PyObject *)&AStream_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
