/* dispatch(): an op's remembered call signatures, keyed in C and launched through run()'s path;
 * the outputs of an allocating call allocated with torch.empty. */
#include "_launch.h"

PyObject *allocator;

/* The key of a call is a bytes object of 64-bit words (not a tuple: bytes are not tracked by
 * the garbage collector, so dispatch() allocates nothing that can trigger a collection, and one
 * memcmp compares it). Per option a tag, then its value: the tag holds the exact type, because
 * 128 and 128.0, 1 and True compare equal in Python while the op's checks refuse the float and
 * the bool, so a hit must never stand in for them. */
#define KEY_WORDS 512

typedef struct {
    int64_t words[KEY_WORDS];
    Py_ssize_t n;
} Key;

static int key_put(Key *k, int64_t word) {
    if (k->n >= KEY_WORDS) return -1;
    k->words[k->n++] = word;
    return 0;
}

static int key_int(Key *k, PyObject *o) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) return -1;
    return key_put(k, v);
}

/* Writes one option; -1 for an option of any other type (not keyed: the op's Python path runs). */
static int key_option(Key *k, PyObject *o) {
    if (o == Py_None) return key_put(k, OPTION_NONE);
    if (PyBool_Check(o)) return key_put(k, o == Py_True ? OPTION_TRUE : OPTION_FALSE);
    if (PyLong_CheckExact(o)) return key_put(k, OPTION_INT) || key_int(k, o);
    if (PyFloat_CheckExact(o)) {
        double v = PyFloat_AsDouble(o);
        int64_t bits;
        memcpy(&bits, &v, sizeof bits);
        return key_put(k, OPTION_FLOAT) || key_put(k, bits);
    }
    if (PyUnicode_CheckExact(o)) {
        Py_ssize_t length;
        const char *text = PyUnicode_AsUTF8AndSize(o, &length); /* cached by the str: no copy */
        Py_ssize_t words = (length + 7) / 8;
        if (text == NULL || key_put(k, OPTION_STR) || key_put(k, length) || k->n + words > KEY_WORDS) return -1;
        if (words > 0) k->words[k->n + words - 1] = 0; /* the padding of the last word */
        memcpy(&k->words[k->n], text, (size_t)length);
        k->n += words;
        return 0;
    }
    if (PyTuple_CheckExact(o)) {
        Py_ssize_t length = PyTuple_Size(o);
        if (key_put(k, OPTION_TUPLE) || key_put(k, length)) return -1;
        for (Py_ssize_t i = 0; i < length; i++) {
            PyObject *item = PyTuple_GetItem(o, i);
            if (!PyLong_CheckExact(item) || key_int(k, item)) return -1;
        }
        return 0;
    }
    return -1;
}

/* The key of a call (inputs, out, *options) under a fast path's spec, or NULL (declined; an error
 * may be set). The inputs are read into exports / inputs (the caller releases *held of
 * them; by input position, NULL for a None input). Key: per input its DLPack dtype, ndim and the
 * dimensions its spec mask names (0 for an absent input), per option its tag and value, then
 * the first input's device and whether out is None. */
static PyObject *call_key(const int64_t *spec, Py_ssize_t n_spec, PyObject *const *call, Py_ssize_t n_call,
                          Exported *exports, Py_ssize_t *held, DLTensor **inputs) {
    Reader r = {spec, n_spec};
    int64_t version, n_inputs, arity, mask;
    *held = 0;
    if (next(&r, &version) || version != FAST_VERSION || next(&r, &n_inputs) || n_inputs < 1 ||
        n_inputs > MAX_TENSORS || next(&r, &arity) || n_call < n_inputs + 1)
        return NULL;
    Key k;
    k.n = 0;
    int device = -1;
    for (int64_t i = 0; i < n_inputs; i++) {
        inputs[i] = NULL;
        if (next(&r, &mask)) return NULL;
        if (call[i] == Py_None) {
            if (key_put(&k, 0)) return NULL; /* a dtype word is never 0: lanes >= 1 */
            continue;
        }
        if (export_tensors(call, (const Py_ssize_t[]){(Py_ssize_t)i}, 1, &exports[*held], &inputs[i]) != 1)
            return NULL;
        *held += 1;
        const DLTensor *t = inputs[i];
        if (device < 0) device = t->device.device_id;
        uint32_t dtype = (uint32_t)t->dtype.code | ((uint32_t)t->dtype.bits << 8) | ((uint32_t)t->dtype.lanes << 16);
        if (key_put(&k, dtype) || key_put(&k, t->ndim)) return NULL;
        for (int d = 0; d < t->ndim && d < 63; d++) {
            if ((mask >> d & 1) && key_put(&k, t->shape[d])) return NULL;
        }
    }
    if (device < 0 || r.left != 0) return NULL;
    for (Py_ssize_t i = n_inputs + 1; i < n_call; i++) {
        if (key_option(&k, call[i])) return NULL;
    }
    /* An allocating call (out None) is its own signature: its entry also says what to allocate. */
    if (key_put(&k, device) || key_put(&k, call[n_inputs] == Py_None)) return NULL;
    return PyBytes_FromStringAndSize((const char *)k.words, k.n * (Py_ssize_t)sizeof(int64_t));
}

/* out's tensor at index under the spec's arity: out itself (arity 1) or an item of a tuple or
 * list of exactly arity items; NULL (borrowed) otherwise. */
static PyObject *out_item(PyObject *out, int64_t arity, int64_t index) {
    if (arity == 1) return index == 0 ? out : NULL;
    if (PyTuple_CheckExact(out) && PyTuple_Size(out) == arity && index < arity) return PyTuple_GetItem(out, index);
    if (PyList_CheckExact(out) && PyList_Size(out) == arity && index < arity) return PyList_GetItem(out, index);
    return NULL;
}

/* The outputs of an allocating call: torch.empty(*dims, dtype=..., device=...) per output, the
 * dims from the inputs' shapes as the entry's words say (per output its ndim, per dimension
 * (input, dim, times, plus, per): (shape[dim] of input * times + plus) // per, or plus where
 * input is -1); kwargs: per output the dict of its dtype and device. out itself (arity 1) or a
 * tuple, as the op returns them; NULL where the words do not fit the call (an error may be set). */
static PyObject *allocate(PyObject *shape_bytes, PyObject *kwargs, DLTensor *const *inputs, Py_ssize_t n_inputs,
                          int64_t arity) {
    char *buffer;
    Py_ssize_t length;
    if (allocator == NULL || !PyTuple_Check(kwargs) || PyTuple_Size(kwargs) != arity ||
        PyBytes_AsStringAndSize(shape_bytes, &buffer, &length) || length % 8)
        return NULL;
    Reader r = {(const int64_t *)buffer, length / 8};
    PyObject *outputs = PyTuple_New(arity);
    if (outputs == NULL) return NULL;
    for (int64_t o = 0; o < arity; o++) {
        int64_t ndim;
        if (next(&r, &ndim) || ndim < 1 || ndim > 8) goto fail;
        PyObject *dims = PyTuple_New(ndim);
        if (dims == NULL) goto fail;
        for (int64_t d = 0; d < ndim; d++) {
            int64_t input, dim, times, plus, per, size;
            if (next(&r, &input) || next(&r, &dim) || next(&r, &times) || next(&r, &plus) || next(&r, &per) ||
                per < 1 || input < -1 || input >= n_inputs || (input >= 0 && inputs[input] == NULL) ||
                (input >= 0 && (dim < 0 || dim >= inputs[input]->ndim))) {
                Py_DECREF(dims);
                goto fail;
            }
            size = input < 0 ? plus : (inputs[input]->shape[dim] * times + plus) / per;
            PyObject *item = size < 0 ? NULL : PyLong_FromLongLong(size);
            if (item == NULL) {
                Py_DECREF(dims);
                goto fail;
            }
            PyTuple_SetItem(dims, d, item);
        }
        PyObject *tensor = PyObject_Call(allocator, dims, PyTuple_GetItem(kwargs, o));
        Py_DECREF(dims);
        if (tensor == NULL) goto fail;
        PyTuple_SetItem(outputs, o, tensor);
    }
    if (r.left != 0) goto fail;
    if (arity == 1) {
        PyObject *only = PyTuple_GetItem(outputs, 0);
        Py_INCREF(only);
        Py_DECREF(outputs);
        return only;
    }
    return outputs;
fail:
    Py_DECREF(outputs); /* unfilled items are NULL, which the tuple's deallocation skips */
    return NULL;
}

/* dispatch(fast, *inputs, out, *options) -> what the op returns (out, as a tuple where it holds
 * several tensors), or None
 *
 * An op's hot path for a call signature it has seen: fast is (spec, table) from
 * _dispatch.fast_path(); the table maps the key of a call the op's full checks passed to what the
 * launch needs (the launcher's contract, plan and handles, the recipe of its arguments and
 * the op's rules beyond the contract, the constants). One lookup, then run()'s check and launch
 * with the rules in between. None never means "invalid", only "not here": the op's Python path
 * then runs (and names what is wrong). An allocating call (out None) is taken where the op
 * remembered one of its signature with the outputs' shapes: dispatch() allocates them with
 * torch.empty and returns them. */
PyObject *dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != 2 || to_dlpack == NULL ||
        stream_getter == NULL || cu_launch_kernel == NULL || cu_launch_kernel_ex == NULL)
        Py_RETURN_NONE;
    PyObject *spec_bytes = PyTuple_GetItem(args[0], 0), *table = PyTuple_GetItem(args[0], 1);
    char *spec;
    Py_ssize_t spec_length;
    if (!PyDict_Check(table) || PyBytes_AsStringAndSize(spec_bytes, &spec, &spec_length) || spec_length % 8 ||
        spec_length < 24) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const int64_t *words = (const int64_t *)spec;
    PyObject *const *call = args + 1;
    Py_ssize_t n_call = nargs - 1, n_inputs = (Py_ssize_t)words[1];
    int64_t arity = words[2];
    if (n_inputs < 1 || n_call <= n_inputs || arity < 1) Py_RETURN_NONE;
    PyObject *out = call[n_inputs], *result = NULL, *allocated = NULL;
    Exported exports[MAX_TENSORS];
    DLTensor *inputs[MAX_TENSORS];
    Py_ssize_t held = 0;
    PyObject *key = call_key(words, spec_length / 8, call, n_call, exports, &held, inputs);
    PyObject *entry = key == NULL ? NULL : PyDict_GetItemWithError(table, key); /* borrowed */
    Py_XDECREF(key);
    char *recipe;
    Py_ssize_t recipe_length;
    /* An entry of an out= call: (contract, plan, handles, recipe, constants); of an allocating
     * call also (output shapes, output kwargs), and out is what allocate() returns. */
    int found = entry != NULL && PyTuple_Check(entry) && PyTuple_Size(entry) == (out == Py_None ? 7 : 5);
    if (found && out == Py_None) {
        allocated = allocate(PyTuple_GetItem(entry, 5), PyTuple_GetItem(entry, 6), inputs, n_inputs, arity);
        out = allocated;
    }
    if (found && out != NULL &&
        PyBytes_AsStringAndSize(PyTuple_GetItem(entry, 3), &recipe, &recipe_length) == 0 && recipe_length % 8 == 0) {
        PyObject *constants = PyTuple_GetItem(entry, 4);
        Reader r = {(const int64_t *)recipe, recipe_length / 8};
        int64_t n_arguments = 0;
        PyObject *arguments[MAX_ARGS];
        DLTensor *known[MAX_ARGS];
        int ok = next(&r, &n_arguments) == 0 && n_arguments >= 0 && n_arguments <= MAX_ARGS &&
                 PyTuple_Check(constants);
        for (int64_t i = 0; ok && i < n_arguments; i++) {
            int64_t source, index;
            known[i] = NULL;
            if (next(&r, &source) || next(&r, &index) || index < 0) {
                ok = 0;
            } else if (source == FROM_INPUT) {
                ok = index < n_inputs && call[index] != Py_None;
                if (ok) {
                    arguments[i] = call[index];
                    known[i] = inputs[index];
                }
            } else if (source == FROM_OUT) {
                arguments[i] = out_item(out, arity, index);
                ok = arguments[i] != NULL;
            } else if (source == FROM_CONSTANT) {
                ok = index < PyTuple_Size(constants);
                if (ok) arguments[i] = PyTuple_GetItem(constants, index);
            } else {
                ok = 0;
            }
        }
        if (ok && run_arguments(PyTuple_GetItem(entry, 0), PyTuple_GetItem(entry, 1), PyTuple_GetItem(entry, 2),
                                arguments, (Py_ssize_t)n_arguments, known, &r)) {
            if (arity == 1 || PyTuple_CheckExact(out)) {
                Py_INCREF(out);
                result = out;
            } else {
                result = PyList_AsTuple(out);
            }
        }
    }
    release(exports, held);
    Py_XDECREF(allocated); /* result holds its own reference */
    if (result != NULL) return result;
    PyErr_Clear(); /* declined, not failed: the op's Python path will name the problem */
    Py_RETURN_NONE;
}

/* dispatch_key(spec, *inputs, out, *options) -> the key dispatch() looks such a call up by, or None
 * where it never would (an option of another type, an input that is not a tensor). */
PyObject *dispatch_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    char *spec;
    Py_ssize_t spec_length;
    if (nargs < 1 || PyBytes_AsStringAndSize(args[0], &spec, &spec_length)) return NULL;
    if (to_dlpack == NULL || spec_length % 8) Py_RETURN_NONE;
    Exported exports[MAX_TENSORS];
    DLTensor *inputs[MAX_TENSORS];
    Py_ssize_t held = 0;
    PyObject *key = call_key((const int64_t *)spec, spec_length / 8, args + 1, nargs - 1, exports, &held, inputs);
    release(exports, held);
    if (key != NULL) return key;
    PyErr_Clear();
    Py_RETURN_NONE;
}
