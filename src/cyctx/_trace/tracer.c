/*
 * tracer.c -- the native half of cyctx.trace(): a CUPTI callback subscriber that records every
 * context change of the process into a ring buffer (docs/tracing.md, "How it works").
 *
 * The callback runs on the thread that made the driver call, sometimes while the driver holds its
 * own locks, so it never takes, waits for or touches the GIL and calls nothing that can block: no
 * Python API that allocates, no malloc, no lock, no dladdr (the loader's lock, held by a dlopen
 * whose constructors may call the driver). It records the contexts current at the call's entry and
 * exit, the calling thread's Python frames (read without the GIL from its own frame chain: nothing
 * INCREF'd or allocated; the layouts are _cpython.h's) and the return addresses of its native
 * stack, walked out to the C frame of the eval loop that runs the innermost Python frame; they are
 * named (dladdr) when Python drains the buffer. The buffer's slots are claimed with a
 * compare-and-swap on the head (no lock); a full buffer drops the event and counts it. stop()
 * unsubscribes, then waits until no callback runs before the buffer may be unmapped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* CPython's internals (the version gate, the frame layout, finalizing) are _cpython.h's. */
#define CYCTX_CPYTHON_WANT_FRAMES 1
#include "_cpython.h"
#define CYCTX_TRACE_FRAMES CYCTX_CPYTHON_FRAMES

#include <dlfcn.h>
#include <link.h>
#include <unwind.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* CUPTI's ABI (cupti_callbacks.h, cupti_driver_cbid.h, cupti_runtime_cbid.h of CUDA 13). */
#define CB_DOMAIN_DRIVER 1
#define CB_DOMAIN_RUNTIME 2
#define CB_DOMAIN_RESOURCE 3
#define CB_RESOURCE_CONTEXT_CREATED 1
#define CB_RESOURCE_CONTEXT_DESTROY_STARTING 2
#define API_ENTER 0

typedef struct {                   /* CUpti_CallbackData, up to the last field read */
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
} CallbackData;
typedef struct { void *context; } ResourceData;  /* CUpti_ResourceData's first field */

/* Each traced call, and which of its parameters (generated_cuda_meta.h) are contexts, devices. */
enum { ARG_NONE, ARG_CTX, ARG_PCTX, ARG_DEV, ARG_PCTX_DEV, ARG_PCTX_CREATE_V2, ARG_PCTX_CREATE_V3,
       ARG_PCTX_CREATE_V4, ARG_RT_DEV };
typedef struct { int domain; unsigned cbid; int args; } Traced;
static const Traced g_traced[] = {
    {CB_DOMAIN_DRIVER, 303, ARG_CTX},            /* cuCtxSetCurrent */
    {CB_DOMAIN_DRIVER, 14, ARG_CTX},             /* cuCtxPushCurrent */
    {CB_DOMAIN_DRIVER, 323, ARG_CTX},            /* cuCtxPushCurrent_v2 */
    {CB_DOMAIN_DRIVER, 15, ARG_PCTX},            /* cuCtxPopCurrent */
    {CB_DOMAIN_DRIVER, 324, ARG_PCTX},           /* cuCtxPopCurrent_v2 */
    {CB_DOMAIN_DRIVER, 386, ARG_PCTX_DEV},       /* cuDevicePrimaryCtxRetain */
    {CB_DOMAIN_DRIVER, 387, ARG_DEV},            /* cuDevicePrimaryCtxRelease */
    {CB_DOMAIN_DRIVER, 544, ARG_DEV},            /* cuDevicePrimaryCtxRelease_v2 */
    {CB_DOMAIN_DRIVER, 389, ARG_DEV},            /* cuDevicePrimaryCtxReset */
    {CB_DOMAIN_DRIVER, 545, ARG_DEV},            /* cuDevicePrimaryCtxReset_v2 */
    {CB_DOMAIN_DRIVER, 10, ARG_PCTX_CREATE_V2},  /* cuCtxCreate */
    {CB_DOMAIN_DRIVER, 235, ARG_PCTX_CREATE_V2}, /* cuCtxCreate_v2 */
    {CB_DOMAIN_DRIVER, 645, ARG_PCTX_CREATE_V3}, /* cuCtxCreate_v3 */
    {CB_DOMAIN_DRIVER, 757, ARG_PCTX_CREATE_V4}, /* cuCtxCreate_v4 */
    {CB_DOMAIN_DRIVER, 11, ARG_CTX},             /* cuCtxDestroy */
    {CB_DOMAIN_DRIVER, 322, ARG_CTX},            /* cuCtxDestroy_v2 */
    {CB_DOMAIN_RUNTIME, 16, ARG_RT_DEV},         /* cudaSetDevice_v3020 */
    {CB_DOMAIN_RUNTIME, 164, ARG_NONE},          /* cudaDeviceReset_v3020 */
    {CB_DOMAIN_RUNTIME, 123, ARG_NONE},          /* cudaThreadExit_v3020 */
    {CB_DOMAIN_RESOURCE, CB_RESOURCE_CONTEXT_CREATED, ARG_NONE},
    {CB_DOMAIN_RESOURCE, CB_RESOURCE_CONTEXT_DESTROY_STARTING, ARG_NONE},
};
#define N_TRACED ((int)(sizeof g_traced / sizeof g_traced[0]))

static int args_of(int domain, unsigned cbid) {
    for (int i = 0; i < N_TRACED; i++)
        if (g_traced[i].domain == domain && g_traced[i].cbid == cbid) return g_traced[i].args;
    return ARG_NONE;
}

/* ---- Events and the ring --------------------------------------------------------------------- */
#define MAX_PY 6
/* Frames read past the kept ones for the first outside the libraries (the user's line), at most. */
#define MAX_PY_WALK 256
#define MAX_NATIVE 256
#define FILE_LEN 200
#define FUNC_LEN 72
#define NAME_LEN 48

enum { PY_OK, PY_NO_THREAD_STATE, PY_UNSUPPORTED, PY_FINALIZING, PY_OFF };
/* How the native walk ended: in the eval loop, at the stack's end (a thread no Python started),
 * at its limit, not walked; 4 is given in Python (a library unloaded before the naming); STOPPED:
 * before the eval loop of a thread that has one (a frame without unwind information). */
enum { NATIVE_EVAL_LOOP, NATIVE_END, NATIVE_CUT, NATIVE_OFF, NATIVE_STOPPED = 5 };

/* depth: the frame's place in the thread's stack, 0 the innermost. */
typedef struct { char file[FILE_LEN]; char func[FUNC_LEN]; int line, depth; } PyFrameRec;

typedef struct {
    _Atomic uint64_t ready;          /* seq + 1 once written */
    uint64_t seq;
    uint64_t t_ns;                   /* CLOCK_MONOTONIC at the exit (resource: the event) */
    uint64_t t_enter_ns;
    long tid;
    int domain, cbid, result, gil, py_state, n_py, n_native, native_state, nested_overflow;
    int py_cut;                      /* the read stopped at MAX_PY_WALK, no user's line found */
    char func[NAME_LEN];
    char via[NAME_LEN];              /* the enclosing traced call on this thread, if any */
    uintptr_t before, after, arg_ctx;
    uint64_t before_id, after_id, arg_ctx_id;
    int before_dev, after_dev, arg_dev;
    long long subs;                  /* the loader's count of unloads as the walk began */
    uintptr_t ts_interp;             /* the calling thread's thread state: its interpreter ... */
    uint64_t ts_id;                  /* ... and unique id (0: none); names the thread at stop */
    uint64_t outside[MAX_NATIVE / 64]; /* bit i: native[i] was in no loaded object when walked */
    /* Then native_frames return addresses, then python_frames Python frames and PY_EXTRA more
     * (the user's line found past them and the library frame it called). */
    uintptr_t native[];
} Event;
#define PY_EXTRA 2
#define PREFAULT_BYTES ((size_t)64 << 20)

static char *g_ring;                 /* mapped, its pages touched as events fill them */
static size_t g_ring_bytes;
static uint64_t g_cap;
static size_t g_slot;                /* bytes per slot */
static size_t g_py_off;              /* where a slot's Python frames begin */
static _Atomic uint64_t g_head, g_tail, g_dropped;
static _Atomic int g_on;             /* the callback records */
static _Atomic int g_inflight;       /* callbacks inside record code now */
static int g_subscribed;
static int g_py_max = 4, g_native_max = 16;

/* Driver calls the callback makes (never traced): resolved at start. */
static int (*d_get_current)(void **);
static int (*d_get_id)(void *, unsigned long long *);
static int (*d_get_device)(int *);

/* CUPTI: its callback API (cupti_callbacks.h), found in the libcupti given at start. */
typedef struct {                   /* CUpti_SubscriberParams of CUDA 13.2 */
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;       /* a refusal writes the other subscriber's name here */
    size_t oldSubscriberSize;
    uint8_t allowMultipleSubscribers;  /* from 13.2 */
    uint8_t padding[7];
} SubscriberParams;
/* CUpti_SubscriberParams_STRUCT_SIZE: 13.0 and 13.1 end at oldSubscriberSize and refuse any
 * other size (CUPTI_ERROR_INVALID_PARAMETER); 13.2 adds allowMultipleSubscribers. */
#define PARAMS_SIZE_13_0 (offsetof(SubscriberParams, oldSubscriberSize) + sizeof(size_t))
#define PARAMS_SIZE_13_2 (offsetof(SubscriberParams, padding) + sizeof(((SubscriberParams *)0)->padding))
#define OLD_SUBSCRIBER_NAME_MIN_LEN 64 /* CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN */
#define CUPTI_MULTIPLE_SUBSCRIBERS 39  /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED */
static int (*c_subscribe)(void **, void *, void *);
static int (*c_subscribe_v2)(void **, void *, void *, SubscriberParams *);
static int (*c_get_version)(uint32_t *);
static int (*c_unsubscribe)(void *);
static int (*c_enable)(uint32_t, void *, int, uint32_t);
static int (*c_result_string)(int, const char **);
static void *g_subscriber;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static Event *claim(void) {
    uint64_t h = atomic_load(&g_head);
    do {
        if (h - atomic_load(&g_tail) >= g_cap) {
            atomic_fetch_add(&g_dropped, 1);
            return NULL;
        }
    } while (!atomic_compare_exchange_weak(&g_head, &h, h + 1));
    Event *e = (Event *)(g_ring + (h % g_cap) * g_slot);
    e->seq = h;
    return e;
}

/* A slot's layout for python_frames and native_frames (see Event). */
static size_t py_offset(int native_max) {
    size_t off = offsetof(Event, native) + (size_t)native_max * sizeof(uintptr_t);
    return (off + _Alignof(PyFrameRec) - 1) & ~(_Alignof(PyFrameRec) - 1);
}

static size_t slot_size(int py_max, int native_max) {
    size_t py = py_max ? (size_t)(py_max + PY_EXTRA) * sizeof(PyFrameRec) : 0;
    return (py_offset(native_max) + py + 63) & ~(size_t)63;
}

static PyFrameRec *py_of(Event *e) { return (PyFrameRec *)((char *)e + g_py_off); }

static void copy_name(char *dst, size_t n, const char *src) {
    size_t i = 0;
    if (src)
        for (; src[i] && i + 1 < n; i++) dst[i] = src[i];
    dst[i] = 0;
}

/* ---- Python frames, read without the GIL (see the head comment) ------------------------------ */
/* What marks a file as a library's (attribution.py): a prefix, or a part found anywhere in it. */
typedef struct {
    Py_UCS4 *text;
    char *ascii;                     /* the same, where it is ASCII (NULL otherwise) */
    Py_ssize_t len;
    int anywhere;
} Marker;
static Marker *g_markers;
static int g_n_markers;

#if CYCTX_TRACE_FRAMES
static size_t utf8_len(Py_UCS4 c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

static size_t put_utf8(char *d, Py_UCS4 c) {
    size_t n = utf8_len(c);
    if (n == 1) {
        d[0] = (char)c;
        return 1;
    }
    d[0] = (char)(((0xFF00 >> n) & 0xFF) | (c >> (6 * (n - 1))));  /* 110x, 1110x, 11110x */
    for (size_t i = 1; i < n; i++) d[i] = (char)(0x80 | ((c >> (6 * (n - 1 - i))) & 0x3F));
    return n;
}

/* A str's characters as UTF-8 (a lone surrogate in the 3-byte form "surrogatepass" reads back),
 * read only. A long one keeps its tail, the part that names the file, behind "...". */
static void copy_str(char *dst, size_t n, PyObject *s) {
    dst[0] = 0;
    if (!s || !PyUnicode_Check(s) || !PyUnicode_IS_COMPACT(s) || n < 8) return;
    Py_ssize_t m = PyUnicode_GET_LENGTH(s);
    size_t room = n - 1;
    if (PyUnicode_IS_ASCII(s)) {
        const char *src = (const char *)PyUnicode_DATA(s);
        size_t skip = (size_t)m > room ? (size_t)m - room : 0;
        memcpy(dst, src + skip, (size_t)m - skip);
        dst[(size_t)m - skip] = 0;
        if (skip) memcpy(dst, "...", 3);
        return;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t start = m;
    size_t len = 0;
    while (start > 0) {
        size_t l = utf8_len(PyUnicode_READ(kind, data, start - 1));
        if (len + l > room) break;
        len += l;
        start--;
    }
    size_t j = 0;
    if (start > 0) {
        while (len > room - 3) len -= utf8_len(PyUnicode_READ(kind, data, start++));
        memcpy(dst, "...", 3);
        j = 3;
    }
    for (Py_ssize_t i = start; i < m; i++) j += put_utf8(dst + j, PyUnicode_READ(kind, data, i));
    dst[j] = 0;
}

static int marker_at(int kind, const void *data, Py_ssize_t at, const Marker *m) {
    for (Py_ssize_t j = 0; j < m->len; j++)
        if (PyUnicode_READ(kind, data, at + j) != m->text[j]) return 0;
    return 1;
}

/* Whether a code object's file is a library's (reads only). One that cannot be read is not:
 * the read stops there, and Python's naming judges the frames it has. */
static int is_library(PyObject *file) {
    if (!file || !PyUnicode_Check(file) || !PyUnicode_IS_COMPACT(file)) return 0;
    if (PyUnicode_IS_ASCII(file)) {  /* most are: compared as bytes, where no other can match */
        const char *c = (const char *)PyUnicode_DATA(file);
        size_t n = (size_t)PyUnicode_GET_LENGTH(file);
        for (int i = 0; i < g_n_markers; i++) {
            const Marker *m = &g_markers[i];
            if (!m->ascii || (size_t)m->len > n) continue;
            if (m->anywhere ? memmem(c, n, m->ascii, (size_t)m->len) != NULL
                            : memcmp(c, m->ascii, (size_t)m->len) == 0)
                return 1;
        }
        return 0;
    }
    int kind = PyUnicode_KIND(file);
    const void *data = PyUnicode_DATA(file);
    Py_ssize_t n = PyUnicode_GET_LENGTH(file);
    for (int i = 0; i < g_n_markers; i++) {
        const Marker *m = &g_markers[i];
        if (m->len > n) continue;
        if (!m->anywhere) {
            if (marker_at(kind, data, 0, m)) return 1;
            continue;
        }
        for (Py_ssize_t at = 0; at + m->len <= n; at++)
            if (marker_at(kind, data, at, m)) return 1;
    }
    return 0;
}

static void keep_frame(PyFrameRec *r, _PyInterpreterFrame *f, PyCodeObject *co, int depth) {
    r->line = cyctx_frame_line(f, co);
    copy_str(r->file, FILE_LEN, co->co_filename);
    copy_str(r->func, FUNC_LEN, co->co_qualname);
    r->depth = depth;
}

/* The thread's Python frames, innermost first: the `max` innermost are kept; when all are a
 * library's, the first frame outside the libraries (MAX_PY_WALK deep at most) and the library frame
 * it called too. Finding none, the outermost read is kept; *cut: the bound stopped the read. */
static int read_frames(PyThreadState *ts, PyFrameRec *out, int max, int *cut) {
    _PyInterpreterFrame *f = cyctx_frame_top(ts);
    int n = 0, depth = 0, user = 0;
    _PyInterpreterFrame *prev = NULL;
    PyCodeObject *prev_co = NULL;
    *cut = 0;
    for (; f; f = cyctx_frame_next(f)) {
        PyCodeObject *co = cyctx_frame_code(f);
        if (!co) continue;
        if (depth < max) {
            keep_frame(&out[n++], f, co, depth);
            if (!user && !is_library(co->co_filename)) user = 1;
        } else {
            if (user) return n;
            if (depth >= MAX_PY_WALK) {
                *cut = 1;
                break;
            }
            if (!is_library(co->co_filename)) {
                if (prev && depth - 1 >= max) keep_frame(&out[n++], prev, prev_co, depth - 1);
                keep_frame(&out[n++], f, co, depth);
                return n;
            }
        }
        prev = f;
        prev_co = co;
        depth++;
    }
    if (!user && prev && depth - 1 >= max) keep_frame(&out[n++], prev, prev_co, depth - 1);
    return n;
}
#endif

/* The objects whose frames are the tracer's, CUPTI's and the driver's own (found at start):
 * a run of them below the caller is not kept, nor counted against native_frames. */
#define N_SKIP 3
static uintptr_t g_skip_lo[N_SKIP], g_skip_hi[N_SKIP];

static int driver_side(uintptr_t ip) {
    for (int i = 0; i < N_SKIP; i++)
        if (ip - 1 >= g_skip_lo[i] && ip - 1 < g_skip_hi[i]) return 1;
    return 0;
}

/* Whether pc is in a loaded object (code outside every one, a JIT's, can be freed and reused
 * without an unload the loader counts: its frame is marked, never named after what is loaded
 * there later). Of glibc's _dl_find_object (2.35+, lock-free), else of dl_iterate_phdr. */
static int (*g_find_object)(void *, void *);       /* _dl_find_object, or NULL */

static int in_segment_of(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    uintptr_t pc = *(const uintptr_t *)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && pc - (info->dlpi_addr + ph->p_vaddr) < ph->p_memsz) return 1;
    }
    return 0;
}

static int in_loaded_object(uintptr_t pc) {
    if (g_find_object) {
        /* Room for glibc's struct dl_find_object (reserved words included), were it to grow. */
        _Alignas(16) unsigned char result[256];
        return g_find_object((void *)pc, result) == 0;
    }
    return dl_iterate_phdr(in_segment_of, &pc) == 1;
}

/* At most this many frames are walked, kept or not: a longer stack is cut. */
#define MAX_STEPS 1024
typedef struct { Event *e; int max; uintptr_t boundary; int below; int steps; } Walk;

/* One frame of a walk. A stack pointer (the CFA of the frame it called) beyond the boundary ends
 * the walk: the frame kept last was the eval loop's. The driver-side run below the caller is not
 * kept; a kept frame in no loaded object is marked. */
static _Unwind_Reason_Code walk_step(struct _Unwind_Context *ctx, void *arg) {
    Walk *w = (Walk *)arg;
    Event *e = w->e;
    uintptr_t ip = (uintptr_t)_Unwind_GetIP(ctx);
    if (!ip) return _URC_END_OF_STACK;
    if (w->boundary && (uintptr_t)_Unwind_GetCFA(ctx) > w->boundary) {
        e->native_state = NATIVE_EVAL_LOOP;
        return _URC_END_OF_STACK;
    }
    if (++w->steps > MAX_STEPS) {          /* a stack that never ends: said so, not trusted */
        e->native_state = NATIVE_CUT;
        return _URC_END_OF_STACK;
    }
    if (w->below && driver_side(ip)) return _URC_NO_REASON;
    w->below = 0;
    if (e->n_native >= w->max) {
        e->native_state = NATIVE_CUT;
        return _URC_END_OF_STACK;
    }
    int n = e->n_native++;
    e->native[n] = ip;
    if (!in_loaded_object(ip - 1)) e->outside[n >> 6] |= 1ull << (n & 63);
    return _URC_NO_REASON;
}

/* How many objects the process has unloaded (dlpi_subs; -1: not said). Safe in a callback:
 * dl_iterate_phdr takes the loader's list lock, never held while a library's constructors run. */
static int subs_of(struct dl_phdr_info *info, size_t size, void *arg) {
    long long *out = (long long *)arg;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        *out = (long long)info->dlpi_subs;
    return 1;
}

static long long unloads_now(void) {
    long long n = -1;
    dl_iterate_phdr(subs_of, &n);
    return n;
}

static void walk_native(Event *e, uintptr_t boundary) {
    e->n_native = 0;
    memset(e->outside, 0, sizeof e->outside);
    e->native_state = g_native_max ? NATIVE_END : NATIVE_OFF;
    if (!g_native_max) return;
    /* Only an address on this thread's stack, above (outward of) this frame, can be one. */
    uintptr_t here = (uintptr_t)&boundary;
    Walk w = {e, g_native_max, boundary > here ? boundary : 0, 1, 0};
    _Unwind_Backtrace(walk_step, &w);
    if (w.boundary && e->native_state == NATIVE_END) e->native_state = NATIVE_STOPPED;
}

/* The event's thread, Python frames and native stack; then it is published. */
static void capture(Event *e) {
    e->tid = (long)syscall(SYS_gettid);
    e->gil = PyGILState_Check();
    e->n_py = 0;
    e->py_cut = 0;
    uintptr_t boundary = 0;
    /* Named at stop by its thread state (an OS id may be given again): a thread-local read. */
    int fin = cyctx_finalizing();
    PyThreadState *ts = fin ? NULL : PyGILState_GetThisThreadState();
    e->ts_interp = ts ? (uintptr_t)ts->interp : 0;
    e->ts_id = ts ? ts->id : 0;
    if (!CYCTX_TRACE_FRAMES) {
        e->py_state = g_py_max ? PY_UNSUPPORTED : PY_OFF;
    } else if (fin) {
        e->py_state = PY_FINALIZING;
    } else if (!ts) {
        e->py_state = PY_NO_THREAD_STATE;
    } else {
        boundary = cyctx_eval_boundary(ts);
        e->py_state = g_py_max ? PY_OK : PY_OFF;
#if CYCTX_TRACE_FRAMES
        if (g_py_max) e->n_py = read_frames(ts, py_of(e), g_py_max, &e->py_cut);
#endif
    }
    /* Before the walk: a walk whose count the naming still finds was named by its libraries. */
    e->subs = g_native_max ? unloads_now() : -1;
    walk_native(e, boundary);
    atomic_store_explicit(&e->ready, e->seq + 1, memory_order_release);  /* published */
}

/* ---- The callback ---------------------------------------------------------------------------- */
#define MAX_NEST 8
typedef struct {
    int domain, cbid;
    const char *name;
    uint64_t t;
    uintptr_t before, arg_ctx;
    uint64_t before_id, arg_ctx_id;
    int before_dev;
} Pending;
static _Thread_local Pending t_pend[MAX_NEST];
static _Thread_local int t_depth;        /* may exceed MAX_NEST: those are not recorded */

static uint64_t id_of(void *ctx) {
    unsigned long long id = 0;
    if (ctx && d_get_id(ctx, &id) != 0) id = 0;
    return id;
}

static int device_now(void) {
    int dev = -1;
    if (d_get_device(&dev) != 0) dev = -1;
    return dev;
}

static void on_resource(unsigned cbid, const ResourceData *r) {
    Event *e = claim();
    if (!e) return;
    e->t_ns = e->t_enter_ns = now_ns();
    e->domain = CB_DOMAIN_RESOURCE;
    e->cbid = (int)cbid;
    e->result = 0;
    copy_name(e->func, NAME_LEN, cbid == CB_RESOURCE_CONTEXT_CREATED ? "context created"
                                                                      : "context destroy starting");
    int d = t_depth < MAX_NEST ? t_depth : MAX_NEST;
    copy_name(e->via, NAME_LEN, d > 0 ? t_pend[d - 1].name : "");
    e->nested_overflow = t_depth > MAX_NEST;
    e->before = e->after = 0;
    e->before_id = e->after_id = e->arg_ctx_id = 0;
    e->before_dev = e->after_dev = e->arg_dev = -1;
    e->arg_ctx = (uintptr_t)(r ? r->context : NULL);
    capture(e);
}

static void on_api(int domain, unsigned cbid, const CallbackData *d) {
    int args = args_of(domain, cbid);
    const void *p = d->functionParams;
    if (d->callbackSite == API_ENTER) {
        int k = t_depth++;
        if (k >= MAX_NEST) return;
        Pending *q = &t_pend[k];
        q->domain = domain;
        q->cbid = (int)cbid;
        q->name = d->functionName;
        q->t = now_ns();
        q->before = (uintptr_t)d->context;
        q->before_id = id_of(d->context);
        q->before_dev = d->context ? device_now() : -1;
        q->arg_ctx = q->arg_ctx_id = 0;
        if (p && args == ARG_CTX) {
            q->arg_ctx = (uintptr_t) * (void *const *)p;
            q->arg_ctx_id = id_of(*(void *const *)p);
        }
        return;
    }
    if (t_depth == 0) return;            /* an exit whose entry came before the trace started */
    int k = --t_depth;
    if (k >= MAX_NEST) return;
    Pending *q = &t_pend[k];
    if (q->cbid != (int)cbid || q->domain != domain) return;   /* unpaired: not recorded */
    Event *e = claim();
    if (!e) return;
    e->t_enter_ns = q->t;
    e->t_ns = now_ns();
    e->domain = domain;
    e->cbid = (int)cbid;
    e->result = d->functionReturnValue ? *(const int *)d->functionReturnValue : 0;
    copy_name(e->func, NAME_LEN, d->functionName);
    copy_name(e->via, NAME_LEN, k > 0 ? t_pend[k - 1].name : "");
    e->nested_overflow = 0;
    e->before = q->before;
    e->before_id = q->before_id;
    e->before_dev = q->before_dev;
    void *after = NULL;
    if (d_get_current(&after) != 0) after = NULL;
    e->after = (uintptr_t)after;
    e->after_id = id_of(after);
    e->after_dev = after ? device_now() : -1;
    e->arg_ctx = q->arg_ctx;
    e->arg_ctx_id = q->arg_ctx_id;
    e->arg_dev = -1;
    if (p) {
        void *const *pp = NULL;
        switch (args) {
        case ARG_PCTX: pp = *(void *const *const *)p; break;
        case ARG_PCTX_DEV:
            pp = *(void *const *const *)p;
            e->arg_dev = *(const int *)((const char *)p + sizeof(void *));
            break;
        case ARG_DEV: case ARG_RT_DEV: e->arg_dev = *(const int *)p; break;
        case ARG_PCTX_CREATE_V2:      /* pctx, flags, dev */
            pp = *(void *const *const *)p;
            e->arg_dev = *(const int *)((const char *)p + sizeof(void *) + sizeof(unsigned));
            break;
        case ARG_PCTX_CREATE_V3:      /* pctx, paramsArray, numParams, flags, dev */
            pp = *(void *const *const *)p;
            e->arg_dev = *(const int *)((const char *)p + 2 * sizeof(void *) + 2 * sizeof(int));
            break;
        case ARG_PCTX_CREATE_V4:      /* pctx, ctxCreateParams, flags, dev */
            pp = *(void *const *const *)p;
            e->arg_dev = *(const int *)((const char *)p + 2 * sizeof(void *) + sizeof(unsigned));
            break;
        default: break;
        }
        if (pp && e->result == 0) {
            e->arg_ctx = (uintptr_t)*pp;
            e->arg_ctx_id = id_of(*pp);
        }
    }
    capture(e);
}

static void callback(void *userdata, int domain, uint32_t cbid, const void *data) {
    (void)userdata;
    /* In-flight first, then the switch: stop() clears the switch, then waits for zero. */
    atomic_fetch_add(&g_inflight, 1);
    if (atomic_load(&g_on) && data) {
        if (domain == CB_DOMAIN_RESOURCE) {
            if (cbid == CB_RESOURCE_CONTEXT_CREATED || cbid == CB_RESOURCE_CONTEXT_DESTROY_STARTING)
                on_resource(cbid, (const ResourceData *)data);
        } else if (domain == CB_DOMAIN_DRIVER || domain == CB_DOMAIN_RUNTIME) {
            on_api(domain, cbid, (const CallbackData *)data);
        }
    }
    atomic_fetch_sub(&g_inflight, 1);
}

/* ---- The module ------------------------------------------------------------------------------ */
/* The span of the loaded object holding addr (driver_side()'s): at start, not in a callback. */
typedef struct { uintptr_t addr, lo, hi; } Span;

static int span_of(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    Span *sp = (Span *)arg;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo) lo = a;
        if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
    }
    if (sp->addr >= lo && sp->addr < hi) {
        sp->lo = lo;
        sp->hi = hi;
        return 1;
    }
    return 0;
}

/* Subscribes `callback`, allowing several subscribers where CUPTI has them (13.2+); a refusal is
 * said into `why`, naming the other subscriber where CUPTI can (cuptiSubscribe_v2, 13.0+). */
static int subscribe(void **sub, char *why, size_t n) {
    uint32_t version = 0;
    if (!c_get_version || c_get_version(&version) != 0) version = 0;
    char other[OLD_SUBSCRIBER_NAME_MIN_LEN] = "";
    int v2 = c_subscribe_v2 && version >= 130000, several = version >= 130200, r;
    if (v2) {
        SubscriberParams p;
        memset(&p, 0, sizeof p);
        p.structSize = several ? PARAMS_SIZE_13_2 : PARAMS_SIZE_13_0;
        p.subscriberName = "cyctx.trace";
        p.oldSubscriberName = other;
        p.oldSubscriberSize = sizeof other;
        p.allowMultipleSubscribers = (uint8_t)several;
        r = c_subscribe_v2(sub, (void *)callback, NULL, &p);
    } else {
        r = c_subscribe(sub, (void *)callback, NULL);
    }
    if (r != CUPTI_MULTIPLE_SUBSCRIBERS) {
        const char *s = NULL;
        if (!c_result_string || c_result_string(r, &s) != 0 || !s) s = "an unknown CUPTI result";
        snprintf(why, n, "cuptiSubscribe failed: %s (%d)", s, r);
        return r;
    }
    other[sizeof other - 1] = 0;
    const char *who = other[0] ? other
                      : v2     ? "CUPTI did not name it"
                      : version ? "a CUPTI older than 13.0 cannot name it: a profiler such as "
                                  "Nsight Systems or torch.profiler"
                                : "this CUPTI did not say its version, so it was not asked who";
    snprintf(why, n, "another CUPTI subscriber holds this process (%s); %s; it is left undisturbed",
             who, several  ? "it allows no second subscriber"
                  : version ? "this CUPTI (older than 13.2) allows one subscriber"
                            : "a CUPTI older than 13.2 allows one subscriber");
    return r;
}

static void free_markers(void) {
    for (int i = 0; i < g_n_markers; i++) {
        PyMem_Free(g_markers[i].text);
        PyMem_Free(g_markers[i].ascii);
    }
    PyMem_Free(g_markers);
    g_markers = NULL;
    g_n_markers = 0;
}

/* The markers of library files, from a sequence of (text, anywhere) pairs; under the GIL, while
 * no callback runs. 0, or -1 with an exception set. */
static int set_markers(PyObject *seq) {
    free_markers();
    if (!seq || seq == Py_None) return 0;
    PyObject *fast = PySequence_Fast(seq, "the library markers are a sequence of (str, bool)");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    g_markers = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Marker));
    if (!g_markers) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text;
        int anywhere;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "Up", &text, &anywhere)) break;
        Marker *m = &g_markers[g_n_markers];
        m->text = PyUnicode_AsUCS4Copy(text);
        if (!m->text) break;
        m->len = PyUnicode_GET_LENGTH(text);
        m->anywhere = anywhere;
        g_n_markers++;
        if (PyUnicode_IS_ASCII(text)) {
            m->ascii = PyMem_Malloc((size_t)m->len + 1);
            if (!m->ascii) {
                PyErr_NoMemory();
                break;
            }
            memcpy(m->ascii, PyUnicode_DATA(text), (size_t)m->len + 1);
        }
    }
    Py_DECREF(fast);
    if (PyErr_Occurred()) {
        free_markers();
        return -1;
    }
    return 0;
}

/* The module's functions that start, stop, drain and free the trace run one at a time, as the
 * GIL had them: without it two threads may call them at once (two stop()s of one trace, a
 * collect() beside a stop()), and a drain would read a buffer a release unmaps. */
#ifdef Py_GIL_DISABLED
static PyMutex g_api_mu;
#define API_LOCK() PyMutex_Lock(&g_api_mu)
#define API_UNLOCK() PyMutex_Unlock(&g_api_mu)
#else
#define API_LOCK() ((void)0)
#define API_UNLOCK() ((void)0)
#endif

static PyObject *start_locked(PyObject *args) {
    const char *cupti_path;
    int py_max, native_max;
    unsigned long long cap;
    PyObject *markers = NULL;
    if (!PyArg_ParseTuple(args, "ziiK|O", &cupti_path, &py_max, &native_max, &cap, &markers))
        return NULL;
    if (g_subscribed) return PyUnicode_FromString("a cyctx trace is already running in this process");
    size_t slot = slot_size(py_max, native_max);
    if (py_max < 0 || py_max > MAX_PY || native_max < 0 || native_max > MAX_NATIVE || cap < 1 ||
        cap > SIZE_MAX / slot) {
        PyErr_SetString(PyExc_ValueError, "bad trace limits");
        return NULL;
    }
    if (set_markers(markers) < 0) return NULL;
    void *lib = cupti_path ? dlopen(cupti_path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) return PyUnicode_FromFormat("libcupti could not be loaded: %s", dlerror());
    const char *why = NULL;
    c_subscribe = (__typeof__(c_subscribe))dlsym(lib, "cuptiSubscribe");
    c_subscribe_v2 = (__typeof__(c_subscribe_v2))dlsym(lib, "cuptiSubscribe_v2");
    c_get_version = (__typeof__(c_get_version))dlsym(lib, "cuptiGetVersion");
    c_unsubscribe = (__typeof__(c_unsubscribe))dlsym(lib, "cuptiUnsubscribe");
    c_enable = (__typeof__(c_enable))dlsym(lib, "cuptiEnableCallback");
    c_result_string = (__typeof__(c_result_string))dlsym(lib, "cuptiGetResultString");
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    typedef int (*pfn_proc)(const char *, void **, int, uint64_t, int *);
    pfn_proc proc = cuda ? (pfn_proc)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    int status = 0;
    void *f1 = NULL, *f2 = NULL, *f3 = NULL;
    if (proc) {
        proc("cuCtxGetCurrent", &f1, 4000, 0, &status);
        proc("cuCtxGetId", &f2, 12000, 0, &status);
        proc("cuCtxGetDevice", &f3, 2000, 0, &status);
    }
    if (cuda) dlclose(cuda);   /* it stays loaded: this handle only counted a reference */
    if (!c_subscribe || !c_unsubscribe || !c_enable)
        why = "the CUPTI library has no callback API (cuptiSubscribe)";
    else if (!proc)
        why = "the CUDA driver (libcuda.so.1) is not loaded";
    else if (!f1 || !f2 || !f3)
        why = "the driver is older than CUDA 12.0 (no cuCtxGetId)";
    if (why) {
        c_subscribe = NULL;
        dlclose(lib);
        free_markers();
        return PyUnicode_FromString(why);
    }
    d_get_current = (__typeof__(d_get_current))f1;
    d_get_id = (__typeof__(d_get_id))f2;
    d_get_device = (__typeof__(d_get_device))f3;

    /* Mapped; its first PREFAULT_BYTES touched here, so that their events take no page fault in
     * the callback; the rest costs memory as events fill it (docs/tracing.md, "Options"). */
    size_t bytes = (size_t)cap * slot;
    char *ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ring == MAP_FAILED) {
        int err = errno;
        dlclose(lib);
        free_markers();
        return PyUnicode_FromFormat("its buffer of %llu events (%zu MiB) could not be mapped: %s",
                                    cap, bytes >> 20, strerror(err));
    }
    memset(ring, 0, bytes < PREFAULT_BYTES ? bytes : PREFAULT_BYTES);
    void *skip[N_SKIP] = {(void *)callback, (void *)c_subscribe, (void *)d_get_current};
    for (int i = 0; i < N_SKIP; i++) {
        Span sp = {(uintptr_t)skip[i], 0, 0};
        if (sp.addr) dl_iterate_phdr(span_of, &sp);
        g_skip_lo[i] = sp.lo;
        g_skip_hi[i] = sp.hi;
    }
    g_find_object = (__typeof__(g_find_object))dlsym(RTLD_DEFAULT, "_dl_find_object");
    {   /* the unwinder's first use reads its tables: here, not in a callback */
        _Alignas(Event) char warm[sizeof(Event) + 4 * sizeof(uintptr_t)];
        int saved = g_native_max;
        g_native_max = 4;
        ((Event *)warm)->subs = -1;
        walk_native((Event *)warm, 0);
        g_native_max = saved;
    }

    void *sub = NULL;
    char text[256];
    int r = subscribe(&sub, text, sizeof text);
    if (r != 0) {
        munmap(ring, bytes);
        dlclose(lib);
        free_markers();
        return PyUnicode_FromString(text);
    }
    g_ring = ring;
    g_ring_bytes = bytes;
    g_cap = cap;
    g_slot = slot;
    g_py_off = py_offset(native_max);
    atomic_store(&g_head, 0);
    atomic_store(&g_tail, 0);
    atomic_store(&g_dropped, 0);
    g_py_max = py_max;
    g_native_max = native_max;
    g_subscriber = sub;
    g_subscribed = 1;
    atomic_store(&g_on, 1);
    /* The simulator has no runtime; a CUPTI that does not know an old id is not an error. */
    for (int i = 0; i < N_TRACED; i++) (void)c_enable(1, sub, g_traced[i].domain, g_traced[i].cbid);
    Py_RETURN_NONE;
}

/* start(cupti_path, python_frames, native_frames, capacity, library_markers=None) -> None or
 * the reason (one line) it could not subscribe; nothing is left changed then. */
static PyObject *t_start(PyObject *self, PyObject *args) {
    (void)self;
    API_LOCK();
    PyObject *r = start_locked(args);
    API_UNLOCK();
    return r;
}

static PyObject *t_stop(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    API_LOCK();
    Py_BEGIN_ALLOW_THREADS
    if (g_subscribed) {
        atomic_store(&g_on, 0);
        c_unsubscribe(g_subscriber);
        while (atomic_load(&g_inflight) > 0) sched_yield();
        g_subscribed = 0;
        g_subscriber = NULL;
    }
    Py_END_ALLOW_THREADS
    API_UNLOCK();
    Py_RETURN_NONE;
}

/* What copy_str and copy_name wrote, back as the str it was. */
static PyObject *str_or_empty(const char *s) {
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogatepass");
}

/* The keys of an event's record (event_tuple), in its order: made once, at import. */
static const char *const KEY_NAMES[] = {
    "seq", "t_ns", "t_enter_ns", "tid", "domain", "cbid", "func", "via", "result", "gil",
    "py_state", "native_state", "nested_overflow", "before", "before_id", "before_dev", "after",
    "after_id", "after_dev", "arg_ctx", "arg_ctx_id", "arg_dev", "subs", "python", "native",
    "outside", "ts", "py_cut",
};
#define N_KEYS ((int)(sizeof KEY_NAMES / sizeof KEY_NAMES[0]))
static PyObject *g_keys[N_KEYS];

static PyObject *event_tuple(Event *e) {
    PyObject *py = PyList_New(e->n_py);
    if (!py) return NULL;
    const PyFrameRec *rec = e->n_py ? py_of(e) : NULL;
    for (int i = 0; i < e->n_py; i++) {
        PyObject *t = Py_BuildValue("(NiNi)", str_or_empty(rec[i].file), rec[i].line,
                                    str_or_empty(rec[i].func), rec[i].depth);
        if (!t) { Py_DECREF(py); return NULL; }
        PyList_SET_ITEM(py, i, t);
    }
    PyObject *nat = PyList_New(e->n_native);
    if (!nat) { Py_DECREF(py); return NULL; }
    for (int i = 0; i < e->n_native; i++) PyList_SET_ITEM(nat, i, PyLong_FromSize_t(e->native[i]));
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < e->n_native; i++) {
        if (!(e->outside[i >> 6] >> (i & 63) & 1)) continue;
        PyObject *k = PyLong_FromLong(i);
        if (!k || PyList_Append(out, k) < 0) Py_CLEAR(out);
        Py_XDECREF(k);
    }
    if (!out) { Py_DECREF(py); Py_DECREF(nat); return NULL; }
    PyObject *d = PyDict_New();
    PyObject *v[N_KEYS] = {
        PyLong_FromUnsignedLongLong(e->seq), PyLong_FromUnsignedLongLong(e->t_ns),
        PyLong_FromUnsignedLongLong(e->t_enter_ns), PyLong_FromLong(e->tid),
        PyLong_FromLong(e->domain), PyLong_FromLong(e->cbid), str_or_empty(e->func),
        str_or_empty(e->via), PyLong_FromLong(e->result), PyLong_FromLong(e->gil),
        PyLong_FromLong(e->py_state), PyLong_FromLong(e->native_state),
        PyLong_FromLong(e->nested_overflow), PyLong_FromUnsignedLongLong(e->before),
        PyLong_FromUnsignedLongLong(e->before_id), PyLong_FromLong(e->before_dev),
        PyLong_FromUnsignedLongLong(e->after), PyLong_FromUnsignedLongLong(e->after_id),
        PyLong_FromLong(e->after_dev), PyLong_FromUnsignedLongLong(e->arg_ctx),
        PyLong_FromUnsignedLongLong(e->arg_ctx_id), PyLong_FromLong(e->arg_dev),
        PyLong_FromLongLong(e->subs), py, nat, out,
        Py_BuildValue("(KK)", (unsigned long long)e->ts_interp, (unsigned long long)e->ts_id),
        PyLong_FromLong(e->py_cut),
    };
    int ok = d != NULL;
    for (int i = 0; i < N_KEYS; i++) {
        if (ok && (!v[i] || PyDict_SetItem(d, g_keys[i], v[i]) < 0)) ok = 0;
        Py_XDECREF(v[i]);
    }
    if (!ok) Py_CLEAR(d);
    return d;
}

static PyObject *drain_locked(void) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    if (g_ring) {
        for (;;) {
            uint64_t t = atomic_load(&g_tail);
            if (t == atomic_load(&g_head)) break;
            Event *e = (Event *)(g_ring + (t % g_cap) * g_slot);
            if (atomic_load_explicit(&e->ready, memory_order_acquire) != t + 1) break;
            PyObject *d = event_tuple(e);
            if (!d || PyList_Append(out, d) < 0) { Py_XDECREF(d); Py_DECREF(out); return NULL; }
            Py_DECREF(d);
            atomic_store(&g_tail, t + 1);
        }
    }
    return Py_BuildValue("(NK)", out, (unsigned long long)atomic_load(&g_dropped));
}

/* drain() -> (events, dropped): every event written so far, in the order of the buffer. */
static PyObject *t_drain(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    API_LOCK();
    PyObject *r = drain_locked();
    API_UNLOCK();
    return r;
}

/* unloads() -> the loader's count of unloads now (-1: it does not count), asked around a
 * collection's naming (session.py). */
static PyObject *t_unloads(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyLong_FromLongLong(unloads_now());
}

/* release(): frees the buffer once the trace is stopped and drained. */
static PyObject *t_release(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    API_LOCK();
    if (!g_subscribed && g_ring) {
        munmap(g_ring, g_ring_bytes);
        g_ring = NULL;
        g_ring_bytes = 0;
        g_cap = 0;
        free_markers();
    }
    API_UNLOCK();
    Py_RETURN_NONE;
}

/* resolve(addresses) -> [(library path or None, symbol or None, offset)]: dladdr, here under
 * the GIL and outside any callback. */
static PyObject *t_resolve(PyObject *self, PyObject *seq) {
    (void)self;
    PyObject *fast = PySequence_Fast(seq, "resolve() takes a sequence of addresses");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        void *a = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred()) { Py_CLEAR(out); break; }
        Dl_info info;
        PyObject *t;
        /* A return address points after the call: look one byte back for its symbol. */
        if (a && dladdr((char *)a - 1, &info) && info.dli_fname) {
            /* Named as Python names files (os.fsdecode): bytes no encoding decodes included. */
            uintptr_t base = (uintptr_t)(info.dli_saddr ? info.dli_saddr : info.dli_fbase);
            PyObject *sym = info.dli_sname ? PyUnicode_DecodeFSDefault(info.dli_sname)
                                           : Py_NewRef(Py_None);
            t = sym ? Py_BuildValue("(NNn)", PyUnicode_DecodeFSDefault(info.dli_fname), sym,
                                    (Py_ssize_t)((uintptr_t)a - base))
                    : NULL;
        } else {
            t = Py_BuildValue("(OOn)", Py_None, Py_None, (Py_ssize_t)0);
        }
        if (!t) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, t);
    }
    Py_DECREF(fast);
    return out;
}

/* slot_bytes(python_frames, native_frames) -> the bytes of the buffer an event takes. */
static PyObject *t_slot_bytes(PyObject *self, PyObject *args) {
    (void)self;
    int py_max, native_max;
    if (!PyArg_ParseTuple(args, "ii", &py_max, &native_max)) return NULL;
    if (py_max < 0 || py_max > MAX_PY || native_max < 0 || native_max > MAX_NATIVE) {
        PyErr_SetString(PyExc_ValueError, "bad trace limits");
        return NULL;
    }
    return PyLong_FromSize_t(slot_size(py_max, native_max));
}

/* live_threads() -> [((interpreter, thread state id), OS thread id)] of every thread state now,
 * or None where they cannot be read safely (a free-threaded build whose layout is not known).
 * Under the GIL: a thread state is unlinked only under it (one being made may be missed: it then
 * names no event). Without the GIL the list is read under the interpreter's own lock of it
 * (_cpython.h), into a local array first: nothing may allocate or call Python under that lock. */
#define MAX_THREADS 4096
typedef struct { uintptr_t interp; uint64_t id; unsigned long os_id; } LiveThread;

static PyObject *t_live_threads(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
#if defined(Py_GIL_DISABLED) && !CYCTX_TRACE_FRAMES
    Py_RETURN_NONE;
#else
    LiveThread *got = PyMem_RawMalloc(MAX_THREADS * sizeof *got);
    if (!got) return PyErr_NoMemory();
    int n = 0;
#ifdef Py_GIL_DISABLED
    cyctx_threads_lock();
#endif
    for (PyInterpreterState *i = PyInterpreterState_Head(); i; i = PyInterpreterState_Next(i))
        for (PyThreadState *t = PyInterpreterState_ThreadHead(i); t && n < MAX_THREADS; t = PyThreadState_Next(t))
            got[n++] = (LiveThread){(uintptr_t)i, t->id, t->native_thread_id};
#ifdef Py_GIL_DISABLED
    cyctx_threads_unlock();
#endif
    PyObject *out = PyList_New(0);
    for (int k = 0; out && k < n; k++) {
        PyObject *x = Py_BuildValue("((KK)k)", (unsigned long long)got[k].interp,
                                    (unsigned long long)got[k].id, got[k].os_id);
        if (!x || PyList_Append(out, x) < 0) Py_CLEAR(out);
        Py_XDECREF(x);
    }
    PyMem_RawFree(got);
    return out;
#endif
}

static PyMethodDef methods[] = {
    {"start", t_start, METH_VARARGS,
     "start(cupti_path, py_frames, native_frames, capacity, library_markers=None)"},
    {"stop", t_stop, METH_NOARGS, "unsubscribe; returns once no callback runs"},
    {"drain", t_drain, METH_NOARGS, "(events, dropped)"},
    {"release", t_release, METH_NOARGS, "free the buffer of a stopped trace"},
    {"unloads", t_unloads, METH_NOARGS, "the loader's count of unloads now (-1: not counted)"},
    {"resolve", t_resolve, METH_O, "dladdr of return addresses"},
    {"slot_bytes", t_slot_bytes, METH_VARARGS, "bytes an event takes: slot_bytes(py, native)"},
    {"live_threads", t_live_threads, METH_NOARGS, "[((interp, thread state id), OS thread id)]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cyctx._trace._native",
                                    "Native half of cyctx.trace() (see tracer.c)", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    for (int i = 0; i < N_KEYS; i++)
        if (!g_keys[i] && !(g_keys[i] = PyUnicode_InternFromString(KEY_NAMES[i]))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef Py_GIL_DISABLED
    /* Its state is safe without the GIL: the buffer's atomics, the functions above one at a
     * time, the frames read by their own thread, the thread list under its lock. */
    PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED);
#endif
    if (PyModule_AddIntConstant(m, "FRAMES_SUPPORTED", CYCTX_TRACE_FRAMES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PY", MAX_PY) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PY_WALK", MAX_PY_WALK) < 0 ||
        PyModule_AddIntConstant(m, "PREFAULT_BYTES", (long)PREFAULT_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NATIVE", MAX_NATIVE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
