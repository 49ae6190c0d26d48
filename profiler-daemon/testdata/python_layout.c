/* CPython's offsets of the fields profilerd reads, from a release's own
 * headers (Py_BUILD_CORE): one 'name value' line each, named as
 * procs/python_runtime.rs's tables name them. Its unit test compiles this
 * against every installed release and compares. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_MINOR_VERSION < 11
#include <frameobject.h>
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#else
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_frame.h>
#endif
#define P(name, v) printf("%s %zu\n", name, (size_t)(v))
int main(void) {
  P("interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
  P("thread_next", offsetof(PyThreadState, next));
#if PY_MINOR_VERSION < 11
  P("threads_head", offsetof(PyInterpreterState, tstate_head));
  P("thread_native_id", offsetof(PyThreadState, thread_id));
  P("current_frame", offsetof(PyThreadState, frame));
  P("frame_code", offsetof(PyFrameObject, f_code));
  P("frame_previous", offsetof(PyFrameObject, f_back));
  P("frame_instr", offsetof(PyFrameObject, f_lasti));
  P("qualname", offsetof(PyCodeObject, co_name));
#if PY_MINOR_VERSION == 9
  P("linetable", offsetof(PyCodeObject, co_lnotab));
#else
  P("linetable", offsetof(PyCodeObject, co_linetable));
#endif
#else
  P("threads_head", offsetof(PyInterpreterState, threads.head));
  P("thread_native_id", offsetof(PyThreadState, native_thread_id));
  P("frame_previous", offsetof(_PyInterpreterFrame, previous));
  P("frame_owner", offsetof(_PyInterpreterFrame, owner));
  P("qualname", offsetof(PyCodeObject, co_qualname));
  P("linetable", offsetof(PyCodeObject, co_linetable));
  P("code_start", offsetof(PyCodeObject, co_code_adaptive));
#if PY_MINOR_VERSION < 13
  P("thread_cframe", offsetof(PyThreadState, cframe));
  P("current_frame", offsetof(_PyCFrame, current_frame));
  P("frame_code", offsetof(_PyInterpreterFrame, f_code));
  P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
  P("current_frame", offsetof(PyThreadState, current_frame));
  P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
  P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
#if PY_MINOR_VERSION == 11
  P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
#endif
  P("filename", offsetof(PyCodeObject, co_filename));
  P("firstlineno", offsetof(PyCodeObject, co_firstlineno));
  P("ascii_size", sizeof(PyASCIIObject));
  P("compact_size", sizeof(PyCompactUnicodeObject));
  return 0;
}
