/* run(): check, grid, stream and launch in one call, as a variant's packed plan says; also the
 * rules dispatch() checks beyond the contract. */
#include "_launch.h"

PyObject *stream_getter;

/* Writes an integer run() computed (a pointer or a size) into its slot, within the range of the
 * parameter kind; -1 where it does not fit (the Python path then raises). */
static int pack_computed(char kind, int64_t v, uint64_t *slot) {
    *slot = 0;
    if (kind == 'Q') {
        if (v < 0) return -1;
        *slot = (uint64_t)v;
        return 0;
    }
    return kind == 'q' || kind == 'i' || kind == 'I' ? pack_integer(kind, v, slot) : -1;
}

/* A plan's launch configuration (the Function's block, shared memory and cooperative flag). */
typedef struct {
    int64_t cooperative, smem, block[3];
} Config;

/* The launch after check(): grid from the sizes, handle of the device, arguments, stream,
 * launch. 1: launched (or nothing to launch); 0: declined (no handle yet, a value out of range,
 * another device's context, a driver error: the Python path retries and reports). */
static int launch_planned(Reader *r, PyObject *const *arguments, Py_ssize_t n_arguments, PyObject *handles,
                          DLTensor *const *tensors, Py_ssize_t n_tensors, const int64_t *sizes, int64_t n_sizes) {
    Config c;
    if (next(r, &c.cooperative) || next(r, &c.block[0]) || next(r, &c.block[1]) || next(r, &c.block[2]) ||
        next(r, &c.smem))
        return 0;
    unsigned grid[3];
    int empty = 0;
    for (int d = 0; d < 3; d++) {
        int64_t g;
        /* CUDA's limits (2^31 - 1 blocks in x, 65535 in y and z): beyond them the Python path raises. */
        if (eval(r, sizes, n_sizes, &g) || g < 0 || g > (d == 0 ? (int64_t)INT32_MAX : 65535)) return 0;
        grid[d] = (unsigned)g;
        empty |= g == 0;
    }
    int64_t n_values;
    if (next(r, &n_values) || n_values < 0 || n_values > MAX_ARGS) return 0;
    if (empty) return r->left == 3 * n_values; /* an empty input: nothing to launch, as `if 0 in grid` */
    int device = tensors[0]->device.device_id;
    PyObject *device_object = PyLong_FromLong(device);
    if (device_object == NULL) return 0;
    PyObject *handle = PyDict_GetItem(handles, device_object); /* borrowed; NULL: first launch here */
    void *kernel = handle == NULL ? NULL : PyLong_AsVoidPtr(handle);
    uint64_t slots[MAX_ARGS];
    void *params[MAX_ARGS];
    int ok = kernel != NULL;
    for (int64_t i = 0; ok && i < n_values; i++) {
        int64_t source, index, kind;
        if (next(r, &source) || next(r, &index) || next(r, &kind)) {
            ok = 0;
        } else if (source == FROM_POINTER) {
            ok = index >= 0 && index < n_tensors &&
                 pack_computed((char)kind, (int64_t)address_of(tensors[index]), &slots[i]) == 0;
            params[i] = &slots[i];
        } else if (source == FROM_SIZE) {
            ok = index >= 0 && index < n_sizes && pack_computed((char)kind, sizes[index], &slots[i]) == 0;
            params[i] = &slots[i];
        } else if (source == FROM_ARGUMENT && index >= 0 && index < n_arguments && kind != 'T') {
            ok = pack((char)kind, arguments[index], &slots[i], &params[i], (Py_ssize_t)i) == 0;
        } else {
            ok = 0;
        }
    }
    void *stream = NULL;
    if (ok && r->left == 0 && exchange != NULL && tensors[0]->device.device_type == KDL_CUDA) {
        /* torch's own getCurrentCUDAStream(device), without the Python call and int round trip */
        ok = exchange->current_work_stream(KDL_CUDA, device, &stream) == 0;
    } else if (ok && r->left == 0) {
        PyObject *s = PyObject_CallFunctionObjArgs(stream_getter, device_object, NULL);
        stream = s == NULL ? NULL : PyLong_AsVoidPtr(s);
        ok = s != NULL && !PyErr_Occurred();
        Py_XDECREF(s);
    } else {
        ok = 0;
    }
    Py_DECREF(device_object);
    if (!ok) return 0;
    unsigned block[3] = {(unsigned)c.block[0], (unsigned)c.block[1], (unsigned)c.block[2]};
    /* Another device's context or a launch the driver refused (which never ran): the Python path
     * switches contexts, launches again or reports. */
    return launch_on(device, kernel, grid, block, (unsigned)c.smem, stream, params, (int)c.cooperative) == 0;
}

static int64_t item_bytes(const DLTensor *t) { return ((int64_t)t->dtype.bits * t->dtype.lanes + 7) / 8; }

/* 1 when every rule holds over the launcher's tensors (by argument position), else 0. */
static int rules_hold(Reader *r, DLTensor *const *by_argument, Py_ssize_t n_arguments) {
    int64_t n_rules;
    if (next(r, &n_rules) || n_rules < 0) return 0;
    for (int64_t n = 0; n < n_rules; n++) {
        int64_t kind, a, i, b, j, k;
        if (next(r, &kind) || next(r, &a) || next(r, &i) || next(r, &b) || next(r, &j) || next(r, &k)) return 0;
        if (a < 0 || a >= n_arguments || by_argument[a] == NULL || i < 0 || i >= by_argument[a]->ndim) return 0;
        const DLTensor *t = by_argument[a];
        int64_t size = t->shape[i];
        switch (kind) {
        case RULE_SAME_SIZE:
            if (b < 0 || b >= n_arguments || by_argument[b] == NULL || j < 0 || j >= by_argument[b]->ndim ||
                by_argument[b]->shape[j] != size * k)
                return 0;
            break;
        case RULE_SIZE_MULTIPLE:
            if (b <= 0 || size % b != 0) return 0;
            break;
        case RULE_SIZE_IS:
            if (size != b) return 0;
            break;
        case RULE_STRIDE_BYTES:
            if (b <= 0 || (size > 1 && (t->strides == NULL || (t->strides[i] * item_bytes(t)) % b != 0))) return 0;
            break;
        default:
            return 0;
        }
    }
    return r->left == 0;
}

/* run()'s body over an argument array: 1 when checked and launched, 0 when declined. known:
 * DLTensors the caller already exported, by argument position (NULL: export it here), or NULL;
 * rules: dispatch()'s checks beyond the contract, or NULL. */
int run_arguments(PyObject *contract_bytes, PyObject *plan_bytes, PyObject *handles, PyObject *const *arguments,
                         Py_ssize_t n_arguments, DLTensor *const *known, Reader *rules) {
    char *contract, *plan;
    Py_ssize_t contract_length, plan_length;
    if (!PyDict_Check(handles) || PyBytes_AsStringAndSize(contract_bytes, &contract, &contract_length) ||
        PyBytes_AsStringAndSize(plan_bytes, &plan, &plan_length) || contract_length % 8 || plan_length % 8)
        return 0;
    Reader r = {(const int64_t *)plan, plan_length / 8};
    int64_t version, expected, n_tensors;
    if (next(&r, &version) || version != PLAN_VERSION || next(&r, &expected) || expected != n_arguments ||
        next(&r, &n_tensors) || n_tensors < 1 || n_tensors > MAX_TENSORS)
        return 0;
    Exported exports[MAX_TENSORS];
    DLTensor *tensors[MAX_TENSORS], *by_argument[MAX_ARGS] = {NULL};
    Py_ssize_t held = 0;
    int ok = n_arguments <= MAX_ARGS;
    for (int64_t i = 0; ok && i < n_tensors; i++) {
        int64_t position;
        if (next(&r, &position) || position < 0 || position >= n_arguments) {
            ok = 0;
        } else if (known != NULL && known[position] != NULL) {
            tensors[i] = known[position];
        } else {
            Py_ssize_t one = (Py_ssize_t)position;
            ok = export_tensors(arguments, &one, 1, &exports[held], &tensors[i]) == 1;
            held += ok;
        }
        if (ok) by_argument[position] = tensors[i];
    }
    int64_t sizes[MAX_SIZES], n_sizes = 0;
    int launched = ok && matches((const int64_t *)contract, contract_length / 8, tensors, n_tensors, sizes,
                                 &n_sizes) == 0 &&
                   (rules == NULL || rules_hold(rules, by_argument, n_arguments)) &&
                   launch_planned(&r, arguments, n_arguments, handles, tensors, n_tensors, sizes, n_sizes);
    release(exports, held);
    return launched;
}

/* run(contract, plan, handles, *arguments) -> True when launched, else False
 *
 * A launcher's whole fast path in one call: check() of the tensor arguments against the
 * contract, then the grid from the runtime sizes, the kernel arguments in the cubin's order,
 * torch's current stream of the tensors' device and cuLaunchKernel (cuLaunchKernelEx for a
 * cooperative kernel), all as the variant's plan says. handles: the Function's dict of
 * device -> kernel handle. False never means "invalid", only "not here": the launcher's
 * Python path then checks (naming the argument), loads the kernel on a new device, switches
 * contexts or reports the driver's error. */
PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || args[0] == Py_None || args[1] == Py_None || to_dlpack == NULL || stream_getter == NULL ||
        cu_launch_kernel == NULL || cu_launch_kernel_ex == NULL)
        Py_RETURN_FALSE;
    int launched = run_arguments(args[0], args[1], args[2], args + 3, nargs - 3, NULL, NULL);
    PyErr_Clear(); /* declined, not failed: the Python path will name the problem */
    if (launched) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}
