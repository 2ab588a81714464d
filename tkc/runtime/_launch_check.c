/* check(): the tensors against the lowered contract, read through DLPack (one DLTensor per tensor,
 * from torch's C exchange API where it has one, else torch._C._to_dlpack), and the reader of the
 * packed words every part uses. */
#include "_launch.h"

PyObject *to_dlpack;
PyObject *exchange_type;
const DLPackExchangeAPI *exchange;

/* Evaluates one expression (Python semantics for // and %) over the bound sizes. */
int eval(Reader *r, const int64_t *sizes, int64_t n_sizes, int64_t *out) {
    int64_t count, stack[MAX_STACK];
    int depth = 0;
    if (next(r, &count) || count < 1) return -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t op, arg;
        if (next(r, &op) || next(r, &arg)) return -1;
        if (op == OP_CONST || op == OP_SIZE) {
            if (depth == MAX_STACK || (op == OP_SIZE && (arg < 0 || arg >= n_sizes))) return -1;
            stack[depth++] = op == OP_CONST ? arg : sizes[arg];
            continue;
        }
        if (depth < 2) return -1;
        int64_t b = stack[--depth], a = stack[depth - 1], v;
        switch (op) {
        case OP_ADD: v = a + b; break;
        case OP_SUB: v = a - b; break;
        case OP_MUL: v = a * b; break;
        case OP_MAX: v = a > b ? a : b; break;
        case OP_MIN: v = a < b ? a : b; break;
        case OP_FLOORDIV:
        case OP_MOD: {
            if (b == 0) return -1;
            int64_t q = a / b, m = a % b;
            if (m != 0 && ((m < 0) != (b < 0))) {
                q -= 1;
                m += b;
            }
            v = op == OP_FLOORDIV ? q : m;
            break;
        }
        default: return -1;
        }
        stack[depth - 1] = v;
    }
    if (depth != 1) return -1;
    *out = stack[0];
    return 0;
}

/* The row-major test of torch's is_contiguous(): dimensions of size 1 are skipped and an
 * empty tensor passes. (DLPack exports strides of size-1 dimensions as 1 anyway.) */
static int row_major(const DLTensor *t) {
    int64_t expected = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return 1;
    }
    if (t->strides == NULL) return 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
        expected *= t->shape[d];
    }
    return 1;
}

static int64_t numel(const DLTensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Bytes from a tensor's first element to the end of its last (0 if empty); torch's strides
 * are never negative. */
static uint64_t extent(const DLTensor *t) {
    int64_t n = numel(t);
    uint64_t item = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8, last = 0;
    if (n == 0) return 0;
    if (t->strides == NULL) return (uint64_t)n * item; /* row-major */
    for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->strides[d];
    return (last + 1) * item;
}

/* 0 unless a tensor the kernel writes (a bit of written) shares a byte range with any other:
 * its threads would read or write it in no fixed order. As _checks.check_disjoint(). */
static int disjoint(DLTensor *const *tensors, Py_ssize_t n_tensors, int64_t written) {
    for (Py_ssize_t i = 0; i < n_tensors; i++) {
        if (!(written >> i & 1)) continue;
        uintptr_t first = (uintptr_t)tensors[i]->data + (uintptr_t)tensors[i]->byte_offset;
        uint64_t size = extent(tensors[i]);
        if (size == 0) continue;
        for (Py_ssize_t j = 0; j < n_tensors; j++) {
            if (j == i) continue;
            uintptr_t other = (uintptr_t)tensors[j]->data + (uintptr_t)tensors[j]->byte_offset;
            uint64_t other_size = extent(tensors[j]);
            if (other_size != 0 && first < other + other_size && other < first + size) return -1;
        }
    }
    return 0;
}

/* The whole comparison; 0 when every tensor matches, -1 when any does not. */
int matches(const int64_t *words, Py_ssize_t n_words, DLTensor *const *tensors, Py_ssize_t n_tensors,
                   int64_t *sizes, int64_t *n_sizes_out) {
    Reader r = {words, n_words};
    int64_t version, count, n_sizes, align_mask, device_type, written;
    if (next(&r, &version) || version != CONTRACT_VERSION || next(&r, &count) || count != n_tensors ||
        next(&r, &n_sizes) || n_sizes < 0 || n_sizes > MAX_SIZES || next(&r, &align_mask) ||
        next(&r, &device_type) || next(&r, &written))
        return -1;
    *n_sizes_out = n_sizes;
    /* The runtime sizes, read from the tensors' shapes and strides first (the Python launcher
     * reads them the same way), each within its kernel parameter's range. */
    for (int64_t i = 0; i < n_sizes; i++) {
        int64_t slot, kind, dim, limit;
        if (next(&r, &slot) || next(&r, &kind) || next(&r, &dim) || next(&r, &limit)) return -1;
        if (slot < 0 || slot >= n_tensors) return -1;
        const DLTensor *t = tensors[slot];
        if (dim < 0 || dim >= t->ndim || (kind == 1 && t->strides == NULL)) return -1;
        int64_t v = kind == 0 ? t->shape[dim] : t->strides[dim];
        if (v < 0 || (limit > 0 && v >= limit)) return -1;
        sizes[i] = v;
    }
    int device = tensors[0]->device.device_id;
    for (Py_ssize_t i = 0; i < n_tensors; i++) {
        const DLTensor *t = tensors[i];
        int64_t dtype, ndim, layout;
        if (next(&r, &dtype) || next(&r, &ndim) || next(&r, &layout)) return -1;
        uint32_t got = (uint32_t)t->dtype.code | ((uint32_t)t->dtype.bits << 8) | ((uint32_t)t->dtype.lanes << 16);
        if (t->device.device_type != device_type || t->device.device_id != device || (int64_t)got != dtype ||
            t->ndim != ndim)
            return -1;
        for (int d = 0; d < ndim; d++) {
            int64_t want;
            if (eval(&r, sizes, n_sizes, &want) || want != t->shape[d]) return -1;
        }
        if (layout == LAYOUT_ROW_MAJOR) {
            if (!row_major(t)) return -1;
        } else if (layout == LAYOUT_STRIDES) {
            /* As check_strides(): an empty tensor is never indexed, a dimension of size 0 or 1
             * never stepped over; the expressions are still read to stay in step. */
            int skip = numel(t) == 0;
            for (int d = 0; d < ndim; d++) {
                int64_t want;
                if (eval(&r, sizes, n_sizes, &want)) return -1;
                if (!skip && t->shape[d] > 1 && (t->strides == NULL || t->strides[d] != want)) return -1;
            }
        } else if (layout != LAYOUT_ANY) {
            return -1;
        }
        uintptr_t address = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
        if (address & (uintptr_t)align_mask) return -1;
    }
    /* The kernel's requirements on its sizes (a spec's requires: tile multiples it trusts), each two
     * expressions that must be equal. */
    int64_t n_requires;
    if (next(&r, &n_requires) || n_requires < 0) return -1;
    for (int64_t i = 0; i < n_requires; i++) {
        int64_t lhs, rhs;
        if (eval(&r, sizes, n_sizes, &lhs) || eval(&r, sizes, n_sizes, &rhs) || lhs != rhs) return -1;
    }
    if (r.left != 0) return -1;
    return disjoint(tensors, n_tensors, written);
}

/* Reads objects[positions[k]] (k-th object when positions is NULL) for k < n into exports and
 * tensors; how many were read: fewer than n when one is not a tensor or has a dtype DLPack
 * lacks (the error is left for the caller to clear). Only objects of exactly the exchange
 * API's type go through it (its producer must be the object's own); subclasses such as
 * nn.Parameter take _to_dlpack. */
static PyObject *is_neg_name, *is_conj_name; /* "is_neg", "is_conj", interned once */

/* 1 when a floating-point tensor is a lazily negated or conjugated view (torch._neg_view(x),
 * x.conj().imag): DLPack exports the memory without the bit, so a kernel would read the values
 * un-negated. Integer and boolean tensors never carry the bits. -1 on an error. */
static int lazy_view(PyObject *object, const DLTensor *t) {
    if (t->dtype.code == 0 || t->dtype.code == 1 || t->dtype.code == 6) return 0; /* kDLInt, kDLUInt, kDLBool */
    if (is_neg_name == NULL && (is_neg_name = PyUnicode_InternFromString("is_neg")) == NULL) return -1;
    if (is_conj_name == NULL && (is_conj_name = PyUnicode_InternFromString("is_conj")) == NULL) return -1;
    PyObject *names[2] = {is_neg_name, is_conj_name};
    for (int i = 0; i < (t->dtype.code == 5 ? 2 : 1); i++) { /* only complex tensors (kDLComplex) conjugate */
        PyObject *bit = PyObject_CallMethodObjArgs(object, names[i], NULL);
        if (bit == NULL) return -1;
        int set = bit == Py_True;
        Py_DECREF(bit);
        if (set) return 1;
    }
    return 0;
}

Py_ssize_t export_tensors(PyObject *const *objects, const Py_ssize_t *positions, Py_ssize_t n,
                                 Exported *exports, DLTensor **tensors) {
    Py_ssize_t held = 0;
    for (; held < n; held++) {
        PyObject *object = objects[positions == NULL ? held : positions[held]];
        Exported *e = &exports[held];
        e->capsule = NULL;
        if (exchange != NULL && (PyObject *)Py_TYPE(object) == exchange_type) {
            if (exchange->dltensor_from_py_object_no_sync(object, &e->view) != 0 || lazy_view(object, &e->view))
                break;
            tensors[held] = &e->view;
            continue;
        }
        e->capsule = PyObject_CallFunctionObjArgs(to_dlpack, object, NULL);
        if (e->capsule == NULL) break;
        DLManagedTensor *managed = PyCapsule_GetPointer(e->capsule, "dltensor");
        if (managed == NULL || lazy_view(object, &managed->dl_tensor)) {
            Py_CLEAR(e->capsule);
            break;
        }
        tensors[held] = &managed->dl_tensor;
    }
    return held;
}

/* The capsules' destructor calls the DLPack deleter, which drops torch's reference; a view
 * holds nothing. */
void release(Exported *exports, Py_ssize_t held) {
    for (Py_ssize_t i = 0; i < held; i++) Py_XDECREF(exports[i].capsule);
}

/* check(contract, *tensors) -> (device, *data_pointers, *sizes), or None
 *
 * contract: the bytes tkc packed (tkc/pack.py) (None: there is none, e.g. a dtype this
 * torch cannot export through DLPack); tensors: the launcher's tensor arguments in prim_func
 * order. None means "not accepted here", never "invalid": the Python checks then decide. */
PyObject *check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || args[0] == Py_None || to_dlpack == NULL) Py_RETURN_NONE;
    char *buffer;
    Py_ssize_t length;
    if (PyBytes_AsStringAndSize(args[0], &buffer, &length)) return NULL;
    Py_ssize_t n_tensors = nargs - 1;
    if (n_tensors < 1 || n_tensors > MAX_TENSORS || length % 8) Py_RETURN_NONE;
    Exported exports[MAX_TENSORS];
    DLTensor *tensors[MAX_TENSORS];
    PyObject *result = NULL;
    int64_t sizes[MAX_SIZES], n_sizes = 0;
    Py_ssize_t held = export_tensors(args + 1, NULL, n_tensors, exports, tensors);
    if (held == n_tensors &&
        matches((const int64_t *)buffer, length / 8, tensors, n_tensors, sizes, &n_sizes) == 0) {
        result = PyTuple_New(1 + n_tensors + n_sizes);
        if (result != NULL) {
            PyTuple_SetItem(result, 0, PyLong_FromLong(tensors[0]->device.device_id));
            for (Py_ssize_t i = 0; i < n_tensors; i++)
                PyTuple_SetItem(result, 1 + i, PyLong_FromUnsignedLongLong(address_of(tensors[i])));
            for (int64_t i = 0; i < n_sizes; i++) PyTuple_SetItem(result, 1 + n_tensors + i, PyLong_FromLongLong(sizes[i]));
        }
    }
    release(exports, held);
    if (result == NULL) {
        PyErr_Clear(); /* declined, not failed: the Python checks will name the problem */
        Py_RETURN_NONE;
    }
    return result;
}

/* dlpack_dtype(tensor) -> code | bits << 8 | lanes << 16 of the tensor's DLTensor, read as
 * check() reads tensors: how this torch spells a dtype in DLPack (float8 codes changed between
 * DLPack versions), asked once per dtype for the contracts. */
PyObject *dlpack_dtype(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || to_dlpack == NULL) {
        PyErr_SetString(PyExc_TypeError, "dlpack_dtype(tensor), after set_dlpack()");
        return NULL;
    }
    Exported exported;
    DLTensor *t;
    if (export_tensors(args, NULL, 1, &exported, &t) != 1) return NULL;
    DLDataType d = t->dtype;
    release(&exported, 1);
    return PyLong_FromUnsignedLong((unsigned long)d.code | ((unsigned long)d.bits << 8) | ((unsigned long)d.lanes << 16));
}
