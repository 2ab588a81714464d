/* The launch fast path of the generated loader: one C call from Python to cuLaunchKernel.
 *
 * Compiled by tkc into every package it can (_launch.abi3.so, CPython's stable ABI, so one
 * build serves Python 3.10 and later) and shipped next to this source. The loader calls
 * launch() for every plain kernel launch and falls back to an equivalent ctypes path when
 * the module is missing. Through ctypes a launch costs a foreign call with 11 converted
 * arguments plus a struct.pack_into of the kernel's arguments; here it is one METH_FASTCALL
 * call that writes the arguments into a stack buffer.
 *
 * The module links against nothing but Python: _driver.py loads libcuda.so.1 and hands
 * over the addresses of the two driver entry points (bind()), so neither CUDA headers nor
 * a CUDA toolkit are needed to build it, and no second copy of the driver is opened.
 *
 * check() is the other half of a launcher's cost: validating the tensors against the
 * contract TileLang lowered. In Python that is about fifteen torch metadata calls per launch;
 * here each tensor is read as one DLTensor (DLPack's stable C ABI: data pointer, device, dtype,
 * shape and strides in one struct) and compared with a contract that tkc packed at build
 * time (tkc/pack.py). check() only ever accepts: on anything it does not like
 * it returns None and the launcher's Python checks decide, and raise errors that name the
 * argument.
 *
 * The DLTensor comes from torch's DLPack C exchange API where this torch has one
 * (Tensor.__dlpack_c_exchange_api__, DLPack 1.2 and later: a C function that fills a DLTensor
 * on our stack, no Python call, no allocation), else from torch._C._to_dlpack (a Python call
 * that allocates a managed tensor and its capsule, about 0.3 us on an H200 host).
 *
 * run() is both in one call, and what the generated launchers try first: check(), then the
 * grid, the kernel arguments and the launch as the variant's plan (tkc/pack.py) says.
 * Reading check()'s results back into Python, building the grid and argument tuples and
 * calling launch() cost about as much as the check itself.
 */
#include "_launch.h"

/* The module is in parts, one per responsibility, which share _launch.h:
 *   _launch_kernel.c    launch(): arguments into slots, the driver call
 *   _launch_check.c     check(): DLPack reads, the packed contract, the word reader
 *   _launch_run.c       run(): check and launch as the packed plan says
 *   _launch_dispatch.c  dispatch(): call keys, output allocation
 * This file holds what binds them to torch (the set_...() calls) and the module's table. */

/* Keeps the callable of a set_...() call in *slot; usage: the error's text otherwise. */
static PyObject *keep_callable(PyObject **slot, PyObject *const *args, Py_ssize_t nargs, const char *usage) {
    if (nargs != 1 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_XDECREF(*slot);
    Py_INCREF(args[0]);
    *slot = args[0];
    Py_RETURN_NONE;
}

/* set_stream(torch._C._cuda_getCurrentRawStream): the stream getter run() calls with the device. */
static PyObject *set_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&stream_getter, args, nargs, "set_stream(torch._C._cuda_getCurrentRawStream)");
}

/* set_dlpack(torch._C._to_dlpack): the export check() calls once per tensor. */
static PyObject *set_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&to_dlpack, args, nargs, "set_dlpack(torch._C._to_dlpack)");
}

/* set_exchange(type, api) -> True when run(), check() and dispatch() now read objects of
 * exactly this type through api (Tensor.__dlpack_c_exchange_api__: a capsule named
 * "dlpack_exchange_api", or its address as an int), False when api is not one this module
 * can use (another DLPack major version, an entry missing: _to_dlpack stays).
 * set_exchange(None, None) goes back to _to_dlpack. */
static PyObject *set_exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_exchange(torch.Tensor, torch.Tensor.__dlpack_c_exchange_api__)");
        return NULL;
    }
    const DLPackExchangeAPI *api = NULL;
    if (args[1] != Py_None) {
        if (PyCapsule_CheckExact(args[1])) {
            api = PyCapsule_GetPointer(args[1], "dlpack_exchange_api");
        } else if (PyLong_Check(args[1])) {
            api = PyLong_AsVoidPtr(args[1]);
        }
        if (api == NULL) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        if (!PyType_Check(args[0]) || api->version.major != 1 || api->version.minor < 2 ||
            api->dltensor_from_py_object_no_sync == NULL || api->current_work_stream == NULL)
            Py_RETURN_FALSE;
    }
    exchange = NULL;
    Py_CLEAR(exchange_type);
    if (api == NULL) Py_RETURN_FALSE;
    Py_INCREF(args[0]);
    exchange_type = args[0];
    exchange = api;
    Py_RETURN_TRUE;
}

/* set_allocator(torch.empty): what dispatch() allocates the outputs of an allocating call with. */
static PyObject *set_allocator(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return keep_callable(&allocator, args, nargs, "set_allocator(torch.empty)");
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(cuLaunchKernel, cuCtxGetDevice, cuLaunchKernelEx addresses): the driver entry points launch() calls."},
    {"launch_cooperative", (PyCFunction)(void (*)(void))launch_cooperative, METH_FASTCALL,
     "launch_cooperative(kernel, device, grid, block, shared_bytes, stream, kinds, *values): launch() of a kernel "
     "with a grid-wide barrier (cuLaunchKernelEx, cooperative attribute)."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(kernel, device, grid, block, shared_bytes, stream, kinds, *values) -> CUresult, or -1 when "
     "the current context is another device's."},
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL,
     "check(contract, *tensors) -> (device, *data_pointers, *sizes), or None where the Python checks must decide."},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(contract, plan, handles, *arguments) -> True when checked and launched, False where the Python path must "
     "decide."},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "dispatch(fast, *inputs, out, *options) -> the op's result when a remembered call signature was checked and "
     "launched, None where the op's Python path must decide."},
    {"dispatch_key", (PyCFunction)(void (*)(void))dispatch_key, METH_FASTCALL,
     "dispatch_key(spec, *inputs, out, *options) -> the key dispatch() looks the call up by, or None."},
    {"set_stream", (PyCFunction)(void (*)(void))set_stream, METH_FASTCALL,
     "set_stream(torch._C._cuda_getCurrentRawStream): the stream getter run() calls with the device index."},
    {"set_dlpack", (PyCFunction)(void (*)(void))set_dlpack, METH_FASTCALL,
     "set_dlpack(torch._C._to_dlpack): the DLPack export check() reads tensors through."},
    {"set_allocator", (PyCFunction)(void (*)(void))set_allocator, METH_FASTCALL,
     "set_allocator(torch.empty): what dispatch() allocates the outputs of an allocating call with."},
    {"set_exchange", (PyCFunction)(void (*)(void))set_exchange, METH_FASTCALL,
     "set_exchange(type, api) -> True when tensors of exactly type are read through DLPack's C exchange API "
     "(api: type.__dlpack_c_exchange_api__); set_exchange(None, None) goes back to set_dlpack()'s export."},
    {"dlpack_dtype", (PyCFunction)(void (*)(void))dlpack_dtype, METH_FASTCALL,
     "dlpack_dtype(tensor) -> the packed DLPack dtype (code | bits << 8 | lanes << 16) of the tensor, read as "
     "check() reads it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", "cuLaunchKernel in one C call, and the tensor checks before it.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
