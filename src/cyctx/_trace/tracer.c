/*
 * tracer.c -- the native half of cyctx.trace(): a CUPTI callback subscriber that records every
 * context change of the process into a ring buffer (docs/tracing.md, "How it works").
 *
 * The callback runs on the thread that made the driver call, sometimes while the driver holds
 * its own locks (the resource events). It therefore never takes, waits for or touches the GIL,
 * and calls nothing that can block: no Python API that allocates, no malloc, no lock, no
 * dladdr (which takes the loader's lock, held by a dlopen whose constructors may call the
 * driver). What it does:
 *   - at an API entry: remembers the context current at the call (CUPTI's `context`), its id
 *     and device (cuCtxGetId, cuCtxGetDevice: calls that are never traced themselves);
 *   - at the exit: asks the context current now, then writes one event with the Python frames
 *     of the calling thread and the raw return addresses of its native stack, walked outward
 *     (_Unwind_Backtrace) until the C frame of the eval loop that runs the innermost Python
 *     frame (eval_boundary), so that the native code that frame called is all seen, however
 *     deep the driver's and CUPTI's frames are;
 *     the event says whether the walk reached the eval loop, the stack's end, or its limit;
 *   - a resource event (context created / destroy starting) asks the driver nothing.
 * The Python frames are read without the GIL, from the calling thread's own frame chain: a
 * thread that released the GIL is inside a C call and cannot change its frames until it
 * returns, and every object read (code objects, their name and file strings and line tables)
 * is kept alive by those frames and is immutable; nothing is INCREF'd or allocated. So the same
 * read gives "the Python line that entered this native code" for a thread without the GIL and
 * the full stack for one holding it (PyGILState_Check says which; the event records it). This
 * needs the interpreter's frame layout (internal/pycore_frame.h; pycore_interpframe.h from
 * 3.14), known for CPython 3.11-3.15; on other versions (and free-threaded builds) no Python
 * frame is read and the events say so.
 * The return addresses become library and symbol (dladdr) when Python drains the buffer; a
 * library unloaded between an event's walk and that naming puts the event in doubt (each walk
 * records the loader's count of unloads; check_unloads).
 *
 * The buffer is a fixed array of slots claimed with a compare-and-swap on the head (no lock);
 * a full buffer drops the event and counts it. stop() unsubscribes, then waits until no
 * callback is running before the buffer may be freed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x03100000 && !defined(Py_GIL_DISABLED)
#define CYCTX_TRACE_FRAMES 1
#define Py_BUILD_CORE 1
#if PY_VERSION_HEX >= 0x030E0000
/* 3.14 moved the frame's inline helpers to pycore_interpframe.h; its f_executable is a
 * _PyStackRef (a tagged pointer: PyStackRef_AsPyObjectBorrow strips the tag). */
#include "internal/pycore_interpframe.h"
#else
#include "internal/pycore_frame.h"
#endif
#undef Py_BUILD_CORE
#else
#define CYCTX_TRACE_FRAMES 0
#endif

/* The fast native walk reads x86-64 registers and libgcc's FDE lookup; elsewhere every walk is
 * the unwinder's. */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define FAST_WALK 1
#else
#define FAST_WALK 0
#endif

#include <dlfcn.h>
#include <link.h>
#include <unwind.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
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

typedef struct {
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CallbackData;

typedef struct {
    void *context;
    void *stream;
    void *resourceDescriptor;
} ResourceData;

/* What each traced call's parameters are (generated_cuda_meta.h): which argument is a context,
 * a context out-pointer, a device. */
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

/* ------------------------------------------------------------------------------------------
 * Events and the ring
 * ------------------------------------------------------------------------------------------ */
#define MAX_PY 6
#define MAX_NATIVE 256
#define FILE_LEN 200
#define FUNC_LEN 72
#define NAME_LEN 48

enum { PY_OK, PY_NO_THREAD_STATE, PY_UNSUPPORTED, PY_FINALIZING, PY_OFF };
/* How the native walk ended: in the interpreter's eval loop (the native code between it and
 * the driver is all there), at the stack's end (a thread no Python started), or at its limit
 * (cut short: whoever called the outermost frame seen is not known). */
/* 4 is given in Python (a library unloaded after the walk, before its naming). NATIVE_STOPPED: the walk
 * ended before the eval loop of a thread that has one (a frame without unwind information). */
enum { NATIVE_EVAL_LOOP, NATIVE_END, NATIVE_CUT, NATIVE_OFF, NATIVE_STOPPED = 5 };

typedef struct { char file[FILE_LEN]; char func[FUNC_LEN]; int line; } PyFrameRec;

typedef struct {
    _Atomic uint64_t ready;          /* seq + 1 once written */
    uint64_t seq;
    uint64_t t_ns;                   /* CLOCK_MONOTONIC at the exit (resource: the event) */
    uint64_t t_enter_ns;
    long tid;
    int domain, cbid, result, gil, py_state, n_py, n_native, native_state, nested_overflow;
    char func[NAME_LEN];
    char via[NAME_LEN];              /* the enclosing traced call on this thread, if any */
    uintptr_t before, after, arg_ctx;
    uint64_t before_id, after_id, arg_ctx_id;
    int before_dev, after_dev, arg_dev;
    long long subs;                  /* the loader's count of unloads as the walk began */
    uintptr_t ts_interp;             /* the calling thread's thread state: its interpreter ... */
    uint64_t ts_id;                  /* ... and unique id (0: none); names the thread at stop */
    uint64_t outside[MAX_NATIVE / 64]; /* bit i: native[i] was in no loaded object when walked */
    PyFrameRec py[MAX_PY];
    uintptr_t native[];              /* native_frames of them: a slot is Event plus those */
} Event;

static char *g_ring;
static uint64_t g_cap;
static size_t g_slot;                /* bytes per slot */
static _Atomic uint64_t g_head, g_tail, g_dropped;
static _Atomic int g_on;             /* the callback records */
static _Atomic int g_inflight;       /* callbacks inside record code now */
static int g_subscribed;
static int g_py_max = 4, g_native_max = 16;
/* The loader's count of unloads that the rule table holds rules for (set after a clear; -2:
 * none; -3: being cleared). A walk that finds a later count at its start empties the table
 * first (refresh_rules). */
static _Atomic long long g_rules_subs = -2;

/* Driver calls the callback makes (never traced): resolved at start. */
typedef int (*pfn_get_current)(void **);
typedef int (*pfn_get_id)(void *, unsigned long long *);
typedef int (*pfn_get_device)(int *);
static pfn_get_current d_get_current;
static pfn_get_id d_get_id;
static pfn_get_device d_get_device;

/* CUPTI (or the simulator's cyctxsim_cupti*). */
typedef int (*pfn_subscribe)(void **, void *, void *);
typedef int (*pfn_unsubscribe)(void *);
typedef int (*pfn_enable)(uint32_t, void *, int, uint32_t);
typedef int (*pfn_result_string)(int, const char **);
static pfn_subscribe c_subscribe;
static pfn_unsubscribe c_unsubscribe;
static pfn_enable c_enable;
static pfn_result_string c_result_string;
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

static void publish(Event *e) { atomic_store_explicit(&e->ready, e->seq + 1, memory_order_release); }

static void copy_name(char *dst, size_t n, const char *src) {
    size_t i = 0;
    if (src)
        for (; src[i] && i + 1 < n; i++) dst[i] = src[i];
    dst[i] = 0;
}

/* ------------------------------------------------------------------------------------------
 * Python frames, read without the GIL (see the head comment)
 * ------------------------------------------------------------------------------------------ */
#if CYCTX_TRACE_FRAMES
/* A str's characters as UTF-8 where the object already has them (ASCII, or a cached UTF-8
 * copy), else its Latin-1 characters with '?' for the rest: reads only. A long path keeps its
 * tail, the part that names the file. */
static void copy_str(char *dst, size_t n, PyObject *s) {
    dst[0] = 0;
    if (!s || !PyUnicode_Check(s) || !PyUnicode_IS_COMPACT(s)) return;
    const char *src = NULL;
    Py_ssize_t len = 0;
    if (PyUnicode_IS_ASCII(s)) {
        src = (const char *)PyUnicode_DATA(s);
        len = PyUnicode_GET_LENGTH(s);
    } else if (((PyCompactUnicodeObject *)s)->utf8) {
        src = ((PyCompactUnicodeObject *)s)->utf8;
        len = ((PyCompactUnicodeObject *)s)->utf8_length;
    }
    if (src) {
        Py_ssize_t skip = len > (Py_ssize_t)n - 1 ? len - ((Py_ssize_t)n - 1) : 0;
        memcpy(dst, src + skip, (size_t)(len - skip));
        dst[len - skip] = 0;
        if (skip && n > 4) memcpy(dst, "...", 3);
        return;
    }
    Py_ssize_t m = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t skip = m > (Py_ssize_t)n - 1 ? m - ((Py_ssize_t)n - 1) : 0;
    Py_ssize_t j = 0;
    for (Py_ssize_t i = skip; i < m; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        dst[j++] = c < 128 ? (char)c : '?';
    }
    dst[j] = 0;
}

static int read_frames(PyThreadState *ts, PyFrameRec *out, int max) {
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
#else
    _PyInterpreterFrame *f = ts->cframe ? ts->cframe->current_frame : NULL;
#endif
    int n = 0;
    for (; f && n < max; f = f->previous) {
        if (_PyFrame_IsIncomplete(f)) continue;
#if PY_VERSION_HEX >= 0x030E0000
        if (PyStackRef_IsNull(f->f_executable)) continue;
        PyObject *ex = PyStackRef_AsPyObjectBorrow(f->f_executable);
        if (!ex || !PyCode_Check(ex)) continue;
        PyCodeObject *co = (PyCodeObject *)ex;
#elif PY_VERSION_HEX >= 0x030D0000
        PyObject *ex = f->f_executable;
        if (!ex || !PyCode_Check(ex)) continue;
        PyCodeObject *co = (PyCodeObject *)ex;
#else
        PyCodeObject *co = f->f_code;
#endif
        out[n].line = PyCode_Addr2Line(co, _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT));
        copy_str(out[n].file, FILE_LEN, co->co_filename);
        copy_str(out[n].func, FUNC_LEN, co->co_qualname);
        n++;
    }
    return n;
}
#endif

/* An address inside the C stack frame of the eval loop that runs the thread's innermost Python
 * frame (0: none known): 3.11 and 3.12 keep that activation's _PyCFrame, a local of it, in the
 * thread state; from 3.13 the activation's entry frame, a local of it too, is the first frame
 * of the chain that the C stack owns. The native walk stops at the frame that holds it: the
 * native code called by that Python frame is all below. */
static uintptr_t eval_boundary(PyThreadState *ts) {
#if !CYCTX_TRACE_FRAMES
    (void)ts;
    return 0;
#elif PY_VERSION_HEX < 0x030D0000
    return ts->cframe && ts->cframe != &ts->root_cframe ? (uintptr_t)ts->cframe : 0;
#else
    for (_PyInterpreterFrame *f = ts->current_frame; f; f = f->previous) {
#if PY_VERSION_HEX >= 0x030E0000
        if (f->owner >= FRAME_OWNED_BY_INTERPRETER) return (uintptr_t)f;
#else
        if (f->owner == FRAME_OWNED_BY_CSTACK) return (uintptr_t)f;
#endif
    }
    return 0;
#endif
}

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}


/* The objects whose frames are the tracer's, CUPTI's and the driver's own (found at start):
 * the walk does not keep a run of them below the caller, nor count it against the limit, so
 * native_frames bounds the caller's frames only however deep the driver's are. */
#define N_SKIP 3
static uintptr_t g_skip_lo[N_SKIP], g_skip_hi[N_SKIP];

static int driver_side(uintptr_t ip) {
    for (int i = 0; i < N_SKIP; i++)
        if (ip - 1 >= g_skip_lo[i] && ip - 1 < g_skip_hi[i]) return 1;
    return 0;
}

/* Whether pc is in a loaded object. Code outside every object (a JIT's, its unwind information
 * registered with __register_frame) can be freed and its addresses reused by other code, or a
 * library loaded there, without an unload: so the fast walk keeps no rule for it (its rule is
 * read anew at each walk; a loaded object's change only through the loader, whose unloads the
 * table follows, refresh_rules), and its frame is marked so that the naming does not give it
 * the name of a library loaded at its address since (mark_outside). Asked for each frame the
 * fast walk has no rule for and for each frame of the unwinder's walks: of glibc's
 * _dl_find_object (2.35+, lock-free; found at start), else of dl_iterate_phdr, safe in a
 * callback (unloads_now). */
typedef int (*pfn_find_object)(void *, void *);
static pfn_find_object g_find_object;       /* _dl_find_object, or NULL */
static _Atomic int g_no_find_object;        /* the tests: the dl_iterate_phdr path */

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
    if (g_find_object && !atomic_load_explicit(&g_no_find_object, memory_order_relaxed)) {
        /* Room for glibc's struct dl_find_object (reserved words included), were it to grow. */
        _Alignas(16) unsigned char result[256];
        return g_find_object((void *)pc, result) == 0;
    }
    return dl_iterate_phdr(in_segment_of, &pc) == 1;
}

/* A kept frame that was in no loaded object: named so at the naming, whatever a library
 * loaded at its address by then (dladdr would name that library). */
static void mark_outside(Event *e, int i) { e->outside[i >> 6] |= 1ull << (i & 63); }

/* An event before a walk: no frame, none marked, ended where the stack ends. */
static void walk_reset(Event *e) {
    e->n_native = 0;
    memset(e->outside, 0, sizeof e->outside);
    e->native_state = NATIVE_END;
}

/* At most this many frames are walked, kept or not: a longer stack is cut. */
#define MAX_STEPS 1024
typedef struct { Event *e; int max; uintptr_t boundary; int below; int steps; } Walk;

/* One frame of a walk (either walker), given its return address and its stack pointer (the
 * CFA of the frame it called): says whether the walk goes on. A stack pointer beyond the
 * boundary ends the walk: the frame kept last, whose stack area holds the boundary, was the
 * eval loop's activation. The run of driver-side frames below the caller is not kept. */
static int walk_keep(Walk *w, uintptr_t ip, uintptr_t sp) {
    if (w->boundary && sp > w->boundary) {
        w->e->native_state = NATIVE_EVAL_LOOP;
        return 0;
    }
    if (++w->steps > MAX_STEPS) {          /* a stack that never ends: said so, not trusted */
        w->e->native_state = NATIVE_CUT;
        return 0;
    }
    if (w->below && driver_side(ip)) return 1;
    w->below = 0;
    if (w->e->n_native >= w->max) {
        w->e->native_state = NATIVE_CUT;
        return 0;
    }
    w->e->native[w->e->n_native++] = ip;
    return 1;
}

static _Unwind_Reason_Code walk_step(struct _Unwind_Context *ctx, void *arg) {
    Walk *w = (Walk *)arg;
    uintptr_t ip = (uintptr_t)_Unwind_GetIP(ctx);
    if (!ip) return _URC_END_OF_STACK;
    int n = w->e->n_native;
    if (!walk_keep(w, ip, (uintptr_t)_Unwind_GetCFA(ctx))) return _URC_END_OF_STACK;
    if (w->e->n_native > n && !in_loaded_object(ip - 1)) mark_outside(w->e, n);
    return _URC_NO_REASON;
}

#if FAST_WALK
/* ------------------------------------------------------------------------------------------
 * The fast walk (x86-64): the unwinder's work per frame (find the FDE, parse its CIE, run its
 * CFA program) done once per return address and kept as a rule: where the CFA is (rsp or rbp
 * plus an offset), where the caller's rbp was saved, the return address at CFA-8. A walk is
 * then a few loads per frame. Only the forms an ordinary frame uses are taken; anything else
 * (an expression, a signal frame, a register rule the walk would need and does not keep, no
 * FDE) makes the whole walk the unwinder's, _Unwind_Backtrace, as are walks without a
 * boundary (a thread no Python started: no known end of its stack to bound the reads). Every
 * load is of this thread's stack between the walk's own frame and the boundary.
 * ------------------------------------------------------------------------------------------ */
struct eh_bases { void *tbase; void *dbase; void *func; };
typedef const void *(*pfn_find_fde)(void *, struct eh_bases *);
static pfn_find_fde u_find_fde;           /* libgcc's _Unwind_Find_FDE, found at start */

/* A rule in one word: bit 0 valid, bit 1 CFA from rbp (else rsp), bit 2 rbp saved,
 * bits 16-31 rbp's save offset from the CFA (signed), bits 32-63 the CFA offset (signed). */
#define RULE_OK 1u
#define RULE_CFA_BP 2u
#define RULE_BP_SAVED 4u
#define N_RULES 2048
typedef struct { _Atomic uint64_t seq, ip, rule; } RuleSlot;
static RuleSlot g_rules[N_RULES];
static _Atomic uint64_t g_walks_fast, g_walks_slow;

static uint64_t uleb(const unsigned char **pp, const unsigned char *end, int *bad) {
    uint64_t v = 0;
    unsigned shift = 0;
    const unsigned char *p = *pp;
    for (;;) {
        if (p >= end || shift > 63) { *bad = 1; *pp = end; return 0; }
        unsigned char b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
    }
    *pp = p;
    return v;
}

static int64_t sleb(const unsigned char **pp, const unsigned char *end, int *bad) {
    int64_t v = 0;
    unsigned shift = 0;
    const unsigned char *p = *pp;
    unsigned char b;
    do {
        if (p >= end || shift > 63) { *bad = 1; *pp = end; return 0; }
        b = *p++;
        v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
    *pp = p;
    return v;
}

/* Bytes a pointer of this DW_EH_PE encoding takes (-1: not a form the walk reads). */
static int enc_size(unsigned char enc) {
    if (enc == 0xff) return 0;            /* DW_EH_PE_omit */
    if ((enc & 0x70) == 0x50) return -1;  /* aligned */
    switch (enc & 0x0f) {
    case 0x00: case 0x04: case 0x0c: return 8;
    case 0x02: case 0x0a: return 2;
    case 0x03: case 0x0b: return 4;
    default: return -1;                   /* leb128 and unknown forms */
    }
}

enum { R_SAME, R_OFFSET, R_BAD };
typedef struct { int cfa_reg, cfa_bad; int64_t cfa_off; int bp, ra; int64_t bp_off, ra_off; } CfaState;

/* Runs a CFA program as libgcc's execute_cfa_program does, up to (not including) `until`,
 * keeping the CFA, rbp (6), rsp (7) and the return address (16); 0 on a form it does not take. */
static int run_cfa(const unsigned char *p, const unsigned char *end, uintptr_t *pc, uintptr_t until,
                   uint64_t code_align, int64_t data_align, CfaState *st) {
    CfaState stack[8];
    int depth = 0, bad = 0;
    while (p < end && *pc < until && !bad) {
        unsigned char op = *p++;
        uint64_t reg = 0;
        int64_t off = 0;
        int how = -1;
        switch (op & 0xc0) {
        case 0x40: *pc += (op & 0x3f) * code_align; continue;
        case 0x80:
            reg = op & 0x3f;
            off = (int64_t)uleb(&p, end, &bad) * data_align;
            how = R_OFFSET;
            break;
        case 0xc0: reg = op & 0x3f; how = R_SAME; break;
        default:
            switch (op) {
            case 0x00: continue;                                   /* nop */
            case 0x02: if (p + 1 > end) return 0; *pc += p[0] * code_align; p += 1; continue;
            case 0x03: { uint16_t v; if (p + 2 > end) return 0; memcpy(&v, p, 2); p += 2;
                         *pc += v * code_align; continue; }
            case 0x04: { uint32_t v; if (p + 4 > end) return 0; memcpy(&v, p, 4); p += 4;
                         *pc += v * code_align; continue; }
            case 0x05: reg = uleb(&p, end, &bad); off = (int64_t)uleb(&p, end, &bad) * data_align;
                       how = R_OFFSET; break;
            case 0x06: case 0x08: reg = uleb(&p, end, &bad); how = R_SAME; break;
            case 0x07: reg = uleb(&p, end, &bad); how = R_BAD; break;  /* undefined */
            case 0x09: reg = uleb(&p, end, &bad); (void)uleb(&p, end, &bad); how = R_BAD; break;
            case 0x0a: if (depth == 8) return 0; stack[depth++] = *st; continue;
            case 0x0b: if (depth == 0) return 0; *st = stack[--depth]; continue;
            case 0x0c: st->cfa_reg = (int)uleb(&p, end, &bad);
                       st->cfa_off = (int64_t)uleb(&p, end, &bad); st->cfa_bad = 0; continue;
            case 0x0d: st->cfa_reg = (int)uleb(&p, end, &bad); st->cfa_bad = 0; continue;
            case 0x0e: st->cfa_off = (int64_t)uleb(&p, end, &bad); continue;
            case 0x0f: { uint64_t n = uleb(&p, end, &bad); if (n > (uint64_t)(end - p)) return 0;
                         p += n; st->cfa_bad = 1; continue; }
            case 0x10: case 0x16: {
                reg = uleb(&p, end, &bad);
                uint64_t n = uleb(&p, end, &bad);
                if (n > (uint64_t)(end - p)) return 0;
                p += n;
                how = R_BAD;
                break;
            }
            case 0x11: reg = uleb(&p, end, &bad); off = sleb(&p, end, &bad) * data_align;
                       how = R_OFFSET; break;
            case 0x12: st->cfa_reg = (int)uleb(&p, end, &bad);
                       st->cfa_off = sleb(&p, end, &bad) * data_align; st->cfa_bad = 0; continue;
            case 0x13: st->cfa_off = sleb(&p, end, &bad) * data_align; continue;
            case 0x14: reg = uleb(&p, end, &bad); (void)uleb(&p, end, &bad); how = R_BAD; break;
            case 0x15: reg = uleb(&p, end, &bad); (void)sleb(&p, end, &bad); how = R_BAD; break;
            case 0x2e: (void)uleb(&p, end, &bad); continue;          /* GNU_args_size */
            case 0x2f: reg = uleb(&p, end, &bad); off = -(int64_t)uleb(&p, end, &bad) * data_align;
                       how = R_OFFSET; break;
            default: return 0;                /* set_loc, a vendor's form: not taken */
            }
        }
        /* A register rule: kept for rbp and the return address, refused for rsp (whose value
         * the walk takes to be the CFA), other registers' rules do not matter to the walk. */
        if (reg == 6) { st->bp = how; st->bp_off = off; }
        else if (reg == 16) { st->ra = how; st->ra_off = off; }
        else if (reg == 7) return 0;
    }
    return !bad;
}

/* The rule of the frame whose code is at pc (a return address minus one, or the walk's own
 * point), 0 where the walk does not take it. */
static uint64_t rule_at(uintptr_t pc, uintptr_t until) {
    struct eh_bases bases;
    const unsigned char *fde = (const unsigned char *)u_find_fde((void *)pc, &bases);
    if (!fde) return 0;
    uint32_t flen, delta;
    memcpy(&flen, fde, 4);
    if (flen == 0 || flen == 0xffffffffu) return 0;
    memcpy(&delta, fde + 4, 4);
    const unsigned char *cie = fde + 4 - delta;
    uint32_t clen;
    memcpy(&clen, cie, 4);
    if (clen == 0 || clen == 0xffffffffu) return 0;
    const unsigned char *cend = cie + 4 + clen, *p = cie + 8;
    int bad = 0;
    unsigned char version = *p++;
    if (version != 1 && version != 3) return 0;
    const char *aug = (const char *)p;
    size_t alen = strnlen(aug, (size_t)(cend - p));
    p += alen + 1;
    uint64_t code_align = uleb(&p, cend, &bad);
    int64_t data_align = sleb(&p, cend, &bad);
    uint64_t ra_reg = version == 1 ? (p < cend ? *p++ : (bad = 1, 0)) : uleb(&p, cend, &bad);
    if (bad || ra_reg != 16) return 0;
    unsigned char fenc = 0;
    int z = 0;
    if (aug[0] == 'z') {
        z = 1;
        uint64_t n = uleb(&p, cend, &bad);
        if (bad || n > (uint64_t)(cend - p)) return 0;
        const unsigned char *aend = p + n;
        for (const char *a = aug + 1; *a; a++) {
            if (*a == 'R') { if (p >= aend) return 0; fenc = *p++; }
            else if (*a == 'L') { if (p >= aend) return 0; p++; }
            else if (*a == 'P') {
                if (p >= aend) return 0;
                int k = enc_size(*p++);
                if (k < 0 || p + k > aend) return 0;
                p += k;
            } else return 0;                  /* 'S' (a signal frame) and others */
        }
        p = aend;
    } else if (aug[0]) {
        return 0;
    }
    CfaState st = {-1, 1, 0, R_SAME, R_SAME, 0, 0};
    uintptr_t loc = 0;
    if (!run_cfa(p, cend, &loc, UINTPTR_MAX, code_align, data_align, &st)) return 0;
    const unsigned char *fend = fde + 4 + flen, *q = fde + 8;
    int k = enc_size(fenc);
    if (k <= 0 || q + 2 * k > fend) return 0;
    q += 2 * k;                               /* pc_begin, pc_range: bases.func is the start */
    if (z) {
        uint64_t n = uleb(&q, fend, &bad);
        if (bad || n > (uint64_t)(fend - q)) return 0;
        q += n;
    }
    loc = (uintptr_t)bases.func;
    if (!run_cfa(q, fend, &loc, until, code_align, data_align, &st)) return 0;
    if (st.cfa_bad || (st.cfa_reg != 6 && st.cfa_reg != 7) || st.ra != R_OFFSET || st.ra_off != -8 ||
        st.bp == R_BAD || st.cfa_off < INT32_MIN || st.cfa_off > INT32_MAX ||
        (st.bp == R_OFFSET && (st.bp_off < INT16_MIN || st.bp_off > INT16_MAX)))
        return 0;
    return RULE_OK | (st.cfa_reg == 6 ? RULE_CFA_BP : 0) | (st.bp == R_OFFSET ? RULE_BP_SAVED : 0) |
           ((uint64_t)(uint16_t)(int16_t)st.bp_off << 16) | ((uint64_t)(uint32_t)(int32_t)st.cfa_off << 32);
}

/* The rules are shared by every thread: a slot is a seqlock (odd while written); a reader that
 * sees it change, or a writer that finds it busy, goes without. */
static uint64_t rule_of(uintptr_t pc, uintptr_t until, int *outside) {
    RuleSlot *s = &g_rules[(pc ^ (pc >> 11)) % N_RULES];
    uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (!(q & 1)) {
        uint64_t ip = atomic_load_explicit(&s->ip, memory_order_relaxed);
        uint64_t rule = atomic_load_explicit(&s->rule, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q && ip == until && rule)
            return rule;
    }
    uint64_t rule = rule_at(pc, until);
    if (!rule) return 0;
    if (!in_loaded_object(pc)) {
        *outside = 1;
        return rule;
    }
    if (!(q & 1) &&
        atomic_compare_exchange_strong_explicit(&s->seq, &q, q + 1, memory_order_acq_rel,
                                                memory_order_relaxed)) {
        atomic_store_explicit(&s->ip, until, memory_order_relaxed);
        atomic_store_explicit(&s->rule, rule, memory_order_relaxed);
        atomic_store_explicit(&s->seq, q + 2, memory_order_release);
    }
    return rule;
}

/* Empties every slot, outside any callback, while walkers may read and write: a slot is
 * taken as a writer takes it (even -> odd -> even), so a reader that overlaps sees it change
 * and goes without. A slot being written now is left: its writer computed the rule in its
 * callback for a return address on its own stack, whose library is mapped (that rule is
 * right until an unload that a later check sees). */
static void clear_rules(void) {
    for (int i = 0; i < N_RULES; i++) {
        RuleSlot *s = &g_rules[i];
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
        if ((q & 1) || !atomic_load_explicit(&s->rule, memory_order_relaxed)) continue;
        if (!atomic_compare_exchange_strong_explicit(&s->seq, &q, q + 1, memory_order_acq_rel,
                                                     memory_order_relaxed))
            continue;
        atomic_store_explicit(&s->ip, 0, memory_order_relaxed);
        atomic_store_explicit(&s->rule, 0, memory_order_relaxed);
        atomic_store_explicit(&s->seq, q + 2, memory_order_release);
    }
}

/* Whether the table holds rules for the loader's count of unloads `n` (read now): when it holds
 * an earlier count, the first caller to see it empties it and sets `n`. Walks that see the
 * table being emptied, or a later count than theirs (they began before an unload), use the
 * unwinder. A walk that began before the emptying and inserts a rule after it read that rule
 * for a return address on its own stack, whose library is mapped: right until an unload, which
 * a later count shows. From a callback too: the clear is lock-free, one pass per unload. */
static int refresh_rules(long long n) {
    long long have = atomic_load_explicit(&g_rules_subs, memory_order_acquire);
    if (have == n) return 1;
    if (have == -3 || n < have) return 0;
    if (!atomic_compare_exchange_strong_explicit(&g_rules_subs, &have, -3, memory_order_acq_rel,
                                                 memory_order_acquire))
        return 0;
    clear_rules();
    atomic_store_explicit(&g_rules_subs, n, memory_order_release);
    return 1;
}

/* 1: walked; 0: a frame the rules do not take (the caller then resets the event and walks
 * with the unwinder: the frames kept so far are the same either way). */
static __attribute__((noinline)) int fast_walk(Walk *w, uintptr_t hi) {
    uintptr_t sp, bp, here;
    __asm__ volatile("movq %%rsp, %0\n\tmovq %%rbp, %1\n\tleaq 0(%%rip), %2"
                     : "=r"(sp), "=r"(bp), "=r"(here));
    const uintptr_t lo = sp;
    /* This frame first, at the point just read (its rule there: `until` one past it), then
     * each caller at its return address. */
    uintptr_t pc = here, until = here + 1;
    int own = 1;
    for (;;) {
        int n = w->e->n_native, outside = 0;
        if (!own && !walk_keep(w, until, sp)) return 1;
        uint64_t r = rule_of(pc, until, &outside);
        if (!r) return 0;
        if (outside && w->e->n_native > n) mark_outside(w->e, n);
        uintptr_t cfa = ((r & RULE_CFA_BP) ? bp : sp) + (uintptr_t)(int64_t)(int32_t)(r >> 32);
        if (cfa <= sp) return 0;
        if (cfa > hi) {
            if (own) return 0;
            return walk_keep(w, 0, cfa), 1;    /* beyond the boundary: the eval loop's frame */
        }
        own = 0;
        if (r & RULE_BP_SAVED) {
            uintptr_t at = cfa + (uintptr_t)(int64_t)(int16_t)(r >> 16);
            if (at < lo || at + 8 > hi) return 0;
            memcpy(&bp, (const void *)at, 8);
        }
        if (cfa - 8 < lo) return 0;
        uintptr_t ra;
        memcpy(&ra, (const void *)(cfa - 8), 8);
        if (!ra) return 0;
        sp = cfa;
        pc = ra - 1;
        until = ra;
    }
}
#endif

/* How many objects the process has unloaded (glibc's and musl's dlpi_subs); -1 where the
 * loader does not say. Safe in a callback: dl_iterate_phdr takes the loader's list lock
 * (glibc's dl_load_write_lock, held only while the list changes, never while a library's
 * constructors run, unlike the lock dlopen holds; musl runs them after its lock), and reads the
 * first object only. The unwinder asks it too. */
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

static _Atomic int g_walker;                 /* 0: fast where it can; 1: the unwinder's only */
static _Atomic int g_verify;                 /* the tests: each fast walk redone by the unwinder */
static _Atomic uint64_t g_walk_mismatches;   /* ... and how many of those found other frames */

#if FAST_WALK
/* Walks again with the unwinder what the fast walk just walked, from the same callback (the
 * same stack: a comparison across calls would see the interpreter's own code change as it
 * specialises), keeps the unwinder's frames and counts a difference. The tests only. */
static void verify_walk(Event *e, uintptr_t boundary) {
    uintptr_t fast[MAX_NATIVE];
    uint64_t fast_outside[MAX_NATIVE / 64];
    int n = e->n_native, state = e->native_state;
    memcpy(fast, e->native, (size_t)n * sizeof *fast);
    memcpy(fast_outside, e->outside, sizeof fast_outside);
    if (n && atomic_load_explicit(&g_verify, memory_order_relaxed) == 2) fast[n - 1] ^= 1;
    walk_reset(e);
    Walk w = {e, g_native_max, boundary, 1, 0};
    _Unwind_Backtrace(walk_step, &w);
    if (e->native_state == NATIVE_END) e->native_state = NATIVE_STOPPED;
    if (e->n_native != n || e->native_state != state ||
        memcmp(fast, e->native, (size_t)n * sizeof *fast) != 0 ||
        memcmp(fast_outside, e->outside, sizeof fast_outside) != 0)
        atomic_fetch_add_explicit(&g_walk_mismatches, 1, memory_order_relaxed);
}
#endif

static void walk_native(Event *e, uintptr_t boundary) {
    walk_reset(e);
    if (!g_native_max) {
        e->native_state = NATIVE_OFF;
        return;
    }
    /* Only an address on this thread's stack, above (outward of) this frame, can be one. */
    uintptr_t here = (uintptr_t)&boundary;
    Walk w = {e, g_native_max, boundary > here ? boundary : 0, 1, 0};
#if FAST_WALK
    if (w.boundary && u_find_fde && !atomic_load_explicit(&g_walker, memory_order_relaxed)) {
        /* The kept rules are of the libraries loaded when they were read: right while nothing
         * was unloaded since (a library loaded later takes addresses no rule was read for). */
        if (e->subs >= 0 && refresh_rules(e->subs) && fast_walk(&w, w.boundary)) {
            atomic_fetch_add_explicit(&g_walks_fast, 1, memory_order_relaxed);
            if (atomic_load_explicit(&g_verify, memory_order_relaxed)) verify_walk(e, w.boundary);
            return;
        }
        atomic_fetch_add_explicit(&g_walks_slow, 1, memory_order_relaxed);
        walk_reset(e);
        w = (Walk){e, g_native_max, w.boundary, 1, 0};
    }
#endif
    _Unwind_Backtrace(walk_step, &w);
    if (w.boundary && e->native_state == NATIVE_END) e->native_state = NATIVE_STOPPED;
}


static void capture(Event *e) {
    e->gil = PyGILState_Check();
    e->n_py = 0;
    uintptr_t boundary = 0;
    /* The thread is named at stop after the living thread whose thread state this is: its OS
     * id alone could be one the kernel gave again to a later thread. Reading this thread's own
     * state needs no GIL (PyGILState_GetThisThreadState is a thread-local read). */
    int fin = finalizing();
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
        boundary = eval_boundary(ts);
        e->py_state = g_py_max ? PY_OK : PY_OFF;
#if CYCTX_TRACE_FRAMES
        if (g_py_max) e->n_py = read_frames(ts, e->py, g_py_max);
#endif
    }
    /* Before any rule is read. An unload completes (the loader's lock held throughout) before
     * another library can be loaded at its addresses, so a walk that starts with the count the
     * rules were read under walks no address of a library loaded since; and one whose count
     * the naming (later) still finds was named after the libraries it walked. */
    e->subs = g_native_max ? unloads_now() : -1;
    walk_native(e, boundary);
}

/* ------------------------------------------------------------------------------------------
 * The callback
 * ------------------------------------------------------------------------------------------ */
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
    e->tid = (long)syscall(SYS_gettid);
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
    publish(e);
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
        q->arg_ctx = 0;
        q->arg_ctx_id = 0;
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
    e->tid = (long)syscall(SYS_gettid);
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
        case ARG_PCTX_CREATE_V3: {    /* pctx, paramsArray, numParams, flags, dev */
            pp = *(void *const *const *)p;
            e->arg_dev = *(const int *)((const char *)p + 2 * sizeof(void *) + 2 * sizeof(int));
            break;
        }
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
    publish(e);
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

/* ------------------------------------------------------------------------------------------
 * The module
 * ------------------------------------------------------------------------------------------ */
static const char *result_name(int r) {
    const char *s = NULL;
    if (c_result_string && c_result_string(r, &s) == 0 && s) return s;
    return "an unknown CUPTI result";
}

/* The address span of the loaded object holding each of these addresses (the driver-side
 * objects of driver_side()); found under the GIL at start, never in a callback. */
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

static void find_spans(void *a, void *b, void *c) {
    void *addrs[N_SKIP] = {a, b, c};
    for (int i = 0; i < N_SKIP; i++) {
        Span sp = {(uintptr_t)addrs[i], 0, 0};
        if (sp.addr) dl_iterate_phdr(span_of, &sp);
        g_skip_lo[i] = sp.lo;
        g_skip_hi[i] = sp.hi;
    }
}

/* A check, after the events of a collection were drained and their addresses named: the
 * loader's count of unloads now. An event whose walk began under this count walked and was
 * named with no library unloaded in between: exact; any other is in doubt (Python marks it).
 * The rule table is brought to the count too (refresh_rules), as the next walk would. A loader
 * that does not count unloads gives no such proof (-1): every walk is the unwinder's and every
 * event in doubt. */
static long long check_unloads(void) {
    long long n = unloads_now();
#if FAST_WALK
    if (n >= 0) refresh_rules(n);
#endif
    return n;
}

/* start(cupti_path, simulated, python_frames, native_frames, capacity) -> None or the reason
 * (one line) it could not subscribe; nothing is left changed then. */
static PyObject *t_start(PyObject *self, PyObject *args) {
    (void)self;
    const char *cupti_path;
    int simulated, py_max, native_max;
    unsigned long long cap;
    if (!PyArg_ParseTuple(args, "zpiiK", &cupti_path, &simulated, &py_max, &native_max, &cap))
        return NULL;
    if (g_subscribed) return PyUnicode_FromString("a cyctx trace is already running in this process");
    if (py_max < 0 || py_max > MAX_PY || native_max < 0 || native_max > MAX_NATIVE || cap < 1 ||
        cap > (1ull << 24)) {
        PyErr_SetString(PyExc_ValueError, "bad trace limits");
        return NULL;
    }
    void *lib;
    const char *prefix;
    if (simulated) {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        prefix = "cyctxsim_";
        if (!lib) return PyUnicode_FromString("the simulated driver is not loaded");
    } else {
        lib = cupti_path ? dlopen(cupti_path, RTLD_NOW | RTLD_LOCAL) : NULL;
        prefix = "";
        if (!lib) return PyUnicode_FromFormat("libcupti could not be loaded: %s", dlerror());
    }
    const char *why = NULL;
    char name[64];
#define SYM(var, type, s)                                                                      \
    snprintf(name, sizeof name, "%s%s", prefix, s);                                            \
    var = (type)dlsym(lib, name);
    SYM(c_subscribe, pfn_subscribe, "cuptiSubscribe")
    SYM(c_unsubscribe, pfn_unsubscribe, "cuptiUnsubscribe")
    SYM(c_enable, pfn_enable, "cuptiEnableCallback")
    SYM(c_result_string, pfn_result_string, "cuptiGetResultString")
#undef SYM
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
        return PyUnicode_FromString(why);
    }
    d_get_current = (pfn_get_current)f1;
    d_get_id = (pfn_get_id)f2;
    d_get_device = (pfn_get_device)f3;

    /* Touched here, every page: a first touch in the callback would be a page fault there. */
    size_t slot = (sizeof(Event) + (size_t)native_max * sizeof(uintptr_t) + 63) & ~(size_t)63;
    char *ring = PyMem_RawMalloc((size_t)cap * slot);
    if (!ring) return PyErr_NoMemory();
    memset(ring, 0, (size_t)cap * slot);
    find_spans((void *)callback, (void *)c_subscribe, (void *)d_get_current);
    g_find_object = (pfn_find_object)dlsym(RTLD_DEFAULT, "_dl_find_object");
    atomic_store(&g_rules_subs, -2);   /* the table below holds no rule: the first walk sets it */
#if FAST_WALK
    u_find_fde = (pfn_find_fde)dlsym(RTLD_DEFAULT, "_Unwind_Find_FDE");
    memset((void *)g_rules, 0, sizeof g_rules);   /* no rule outlives its trace */
    atomic_store(&g_walks_fast, 0);
    atomic_store(&g_walks_slow, 0);
    atomic_store(&g_walk_mismatches, 0);
#endif
    {   /* the unwinder's first use reads its tables: here, not in a callback */
        _Alignas(Event) char warm[sizeof(Event) + 4 * sizeof(uintptr_t)];
        int saved = g_native_max;
        g_native_max = 4;
        ((Event *)warm)->subs = -1;
        walk_native((Event *)warm, 0);
        g_native_max = saved;
    }

    void *sub = NULL;
    int r = c_subscribe(&sub, (void *)callback, NULL);
    if (r != 0) {
        PyMem_RawFree(ring);
        const char *rs = result_name(r);
        char text[160];
        snprintf(text, sizeof text, "cuptiSubscribe failed: %s (%d)", rs, r);
        dlclose(lib);
        if (r == 39)
            return PyUnicode_FromString(
                "another CUPTI subscriber holds this process (a profiler: Nsight Systems, "
                "torch.profiler); it is left undisturbed");
        return PyUnicode_FromString(text);
    }
    g_ring = ring;
    g_cap = cap;
    g_slot = slot;
    atomic_store(&g_head, 0);
    atomic_store(&g_tail, 0);
    atomic_store(&g_dropped, 0);
    g_py_max = py_max;
    g_native_max = native_max;
    g_subscriber = sub;
    g_subscribed = 1;
    atomic_store(&g_on, 1);
    for (int i = 0; i < N_TRACED; i++) {
        r = c_enable(1, sub, g_traced[i].domain, g_traced[i].cbid);
        /* The simulator has no runtime; a CUPTI that does not know an old id is not an error. */
        (void)r;
    }
    Py_RETURN_NONE;
}

static void stop_native(void) {
    if (!g_subscribed) return;
    atomic_store(&g_on, 0);
    c_unsubscribe(g_subscriber);
    while (atomic_load(&g_inflight) > 0) sched_yield();
    g_subscribed = 0;
    g_subscriber = NULL;
}

static PyObject *t_stop(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    Py_BEGIN_ALLOW_THREADS
    stop_native();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *str_or_empty(const char *s) { return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace"); }

static PyObject *event_tuple(const Event *e) {
    PyObject *py = PyList_New(e->n_py);
    if (!py) return NULL;
    for (int i = 0; i < e->n_py; i++) {
        PyObject *t = Py_BuildValue("(NiN)", str_or_empty(e->py[i].file), e->py[i].line,
                                    str_or_empty(e->py[i].func));
        if (!t) { Py_DECREF(py); return NULL; }
        PyList_SET_ITEM(py, i, t);
    }
    PyObject *nat = PyList_New(e->n_native);
    if (!nat) { Py_DECREF(py); return NULL; }
    for (int i = 0; i < e->n_native; i++) PyList_SET_ITEM(nat, i, PyLong_FromSize_t(e->native[i]));
    PyObject *out = PyList_New(0);
    if (!out) { Py_DECREF(py); Py_DECREF(nat); return NULL; }
    for (int i = 0; i < e->n_native; i++) {
        if (!(e->outside[i >> 6] >> (i & 63) & 1)) continue;
        PyObject *k = PyLong_FromLong(i);
        if (!k || PyList_Append(out, k) < 0) {
            Py_XDECREF(k); Py_DECREF(py); Py_DECREF(nat); Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
    }
    return Py_BuildValue(
        "{sKsKsKslsisisNsNsisisisisisKsKsisKsKsisKsKsisLsNsNsNsN}", "seq", (unsigned long long)e->seq,
        "t_ns", (unsigned long long)e->t_ns, "t_enter_ns", (unsigned long long)e->t_enter_ns,
        "tid", e->tid, "domain", e->domain, "cbid", e->cbid, "func", str_or_empty(e->func), "via",
        str_or_empty(e->via), "result", e->result, "gil", e->gil, "py_state", e->py_state, "native_state",
        e->native_state,
        "nested_overflow", e->nested_overflow, "before", (unsigned long long)e->before,
        "before_id", (unsigned long long)e->before_id, "before_dev", e->before_dev, "after",
        (unsigned long long)e->after, "after_id", (unsigned long long)e->after_id, "after_dev",
        e->after_dev, "arg_ctx", (unsigned long long)e->arg_ctx, "arg_ctx_id",
        (unsigned long long)e->arg_ctx_id, "arg_dev", e->arg_dev, "subs",
        e->subs, "python", py, "native", nat, "outside", out, "ts",
        Py_BuildValue("(KK)", (unsigned long long)e->ts_interp, (unsigned long long)e->ts_id));
}

/* drain() -> (events, dropped): every event written so far, in the order of the buffer. */
static PyObject *t_drain(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
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

/* check_unloads() -> the loader's count of unloads now, -1 where it does not count (see
 * check_unloads): called by Python after each drain, once the drained events are named. */
static PyObject *t_check_unloads(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyLong_FromLongLong(check_unloads());
}

/* unloads() -> the loader's count of unloads now (-1: it does not count). */
static PyObject *t_unloads(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyLong_FromLongLong(unloads_now());
}

/* rule_count() -> how many slots of the rule table hold a rule (the tests). */
static PyObject *t_rule_count(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    long n = 0;
#if FAST_WALK
    for (int i = 0; i < N_RULES; i++)
        n += atomic_load_explicit(&g_rules[i].rule, memory_order_relaxed) != 0;
#endif
    return PyLong_FromLong(n);
}

/* release(): frees the buffer once the trace is stopped and drained. */
static PyObject *t_release(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    if (!g_subscribed && g_ring) {
        PyMem_RawFree(g_ring);
        g_ring = NULL;
        g_cap = 0;
    }
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
            uintptr_t base = (uintptr_t)(info.dli_saddr ? info.dli_saddr : info.dli_fbase);
            t = Py_BuildValue("(ssn)", info.dli_fname, info.dli_sname,
                              (Py_ssize_t)((uintptr_t)a - base));
        } else {
            t = Py_BuildValue("(OOn)", Py_None, Py_None, (Py_ssize_t)0);
        }
        if (!t) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, t);
    }
    Py_DECREF(fast);
    return out;
}

static PyObject *t_active(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyBool_FromLong(g_subscribed);
}

/* The module's own frames and those of the CUPTI library are not callers: Python drops them. */
static PyObject *t_self_address(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyLong_FromVoidPtr((void *)callback);
}

/* bench(ctx, n, mode) -> seconds for n rounds made through the driver without the GIL
 * (bench/trace_cost.py): mode 0 a cuCtxPushCurrent + cuCtxPopCurrent pair (traced calls),
 * mode 1 a cuCtxGetCurrent + cuCtxGetId pair (calls a trace does not watch). */
static PyObject *t_bench(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long ctx;
    long n;
    int mode;
    if (!PyArg_ParseTuple(args, "Kli", &ctx, &n, &mode)) return NULL;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    typedef int (*pfn_proc)(const char *, void **, int, uint64_t, int *);
    pfn_proc proc = cuda ? (pfn_proc)dlsym(cuda, "cuGetProcAddress_v2") : NULL;
    void *fa = NULL, *fb = NULL;
    int status = 0;
    if (proc) {
        proc(mode ? "cuCtxGetCurrent" : "cuCtxPushCurrent", &fa, 4000, 0, &status);
        proc(mode ? "cuCtxGetId" : "cuCtxPopCurrent", &fb, mode ? 12000 : 4000, 0, &status);
    }
    if (cuda) dlclose(cuda);
    if (!fa || !fb) {
        PyErr_SetString(PyExc_RuntimeError, "no driver loaded");
        return NULL;
    }
    int bad = 0;
    uint64_t t0, t1;
    Py_BEGIN_ALLOW_THREADS
    t0 = now_ns();
    if (mode == 0) {
        int (*push)(void *) = (int (*)(void *))fa;
        int (*pop)(void **) = (int (*)(void **))fb;
        for (long i = 0; i < n; i++) {
            void *x;
            bad |= push((void *)(uintptr_t)ctx);
            bad |= pop(&x);
        }
    } else {
        int (*get)(void **) = (int (*)(void **))fa;
        int (*get_id)(void *, unsigned long long *) = (int (*)(void *, unsigned long long *))fb;
        for (long i = 0; i < n; i++) {
            void *x;
            unsigned long long id;
            bad |= get(&x);
            bad |= get_id((void *)(uintptr_t)ctx, &id);
        }
    }
    t1 = now_ns();
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_RuntimeError, "a driver call failed");
        return NULL;
    }
    return PyFloat_FromDouble((double)(t1 - t0) * 1e-9);
}

/* walk_stats() -> (fast, unwinder's): how many walks of this trace each walker made, of
 * those with a known boundary (bench/trace_cost.py, the tests). */
static PyObject *t_walk_stats(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
#if FAST_WALK
    return Py_BuildValue("(KK)", (unsigned long long)atomic_load(&g_walks_fast),
                         (unsigned long long)atomic_load(&g_walks_slow));
#else
    return Py_BuildValue("(ii)", 0, 0);
#endif
}

/* set_walker(unwinder_only) -> the previous setting: the tests compare the two walkers. */
static PyObject *t_set_walker(PyObject *self, PyObject *arg) {
    (void)self;
    int v = PyObject_IsTrue(arg);
    if (v < 0) return NULL;
    return PyBool_FromLong(atomic_exchange(&g_walker, v));
}

/* set_verify(on) -> the previous setting: each fast walk redone by the unwinder (the tests). */
static PyObject *t_set_verify(PyObject *self, PyObject *arg) {
    (void)self;
    /* 2: the check of the comparison itself, which then alters each fast walk's outermost
     * frame before comparing. */
    long v = PyLong_Check(arg) && !PyBool_Check(arg) ? PyLong_AsLong(arg) : PyObject_IsTrue(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (v < 0 || v > 2) {
        PyErr_SetString(PyExc_ValueError, "set_verify takes 0, 1 or 2");
        return NULL;
    }
    int was = atomic_exchange(&g_verify, (int)v);
    return was == 2 ? PyLong_FromLong(2) : PyBool_FromLong(was);
}

/* live_threads() -> [((interpreter, thread state id), OS thread id)] of every thread state now,
 * or None where they cannot be read safely (a build without the GIL). Under the GIL: a thread
 * state is unlinked only under it; one being made without it may be missed (it then names no
 * event, which is said as an unknown name, not a wrong one). */
static PyObject *t_live_threads(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
#ifdef Py_GIL_DISABLED
    Py_RETURN_NONE;
#else
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (PyInterpreterState *i = PyInterpreterState_Head(); i; i = PyInterpreterState_Next(i))
        for (PyThreadState *t = PyInterpreterState_ThreadHead(i); t; t = PyThreadState_Next(t)) {
            PyObject *x = Py_BuildValue("((KK)k)", (unsigned long long)(uintptr_t)i,
                                        (unsigned long long)t->id, t->native_thread_id);
            if (!x || PyList_Append(out, x) < 0) {
                Py_XDECREF(x);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(x);
        }
    return out;
#endif
}

/* use_find_object(on) -> the previous setting: off, whether code is in a loaded object is
 * asked of dl_iterate_phdr, as on a glibc without _dl_find_object (the tests). */
static PyObject *t_use_find_object(PyObject *self, PyObject *arg) {
    (void)self;
    int v = PyObject_IsTrue(arg);
    if (v < 0) return NULL;
    return PyBool_FromLong(!atomic_exchange(&g_no_find_object, !v));
}

/* walk_mismatches() -> of this trace's fast walks redone by the unwinder, how many differed. */
static PyObject *t_walk_mismatches(PyObject *self, PyObject *noargs) {
    (void)self; (void)noargs;
    return PyLong_FromUnsignedLongLong((unsigned long long)atomic_load(&g_walk_mismatches));
}

static PyMethodDef methods[] = {
    {"start", t_start, METH_VARARGS, "start(cupti_path, simulated, py_frames, native_frames, capacity)"},
    {"stop", t_stop, METH_NOARGS, "unsubscribe; returns once no callback runs"},
    {"drain", t_drain, METH_NOARGS, "(events, dropped)"},
    {"release", t_release, METH_NOARGS, "free the buffer of a stopped trace"},
    {"check_unloads", t_check_unloads, METH_NOARGS,
     "after a drain and its naming: the count of unloads now (see tracer.c)"},
    {"unloads", t_unloads, METH_NOARGS, "the loader's count of unloads now (-1: not counted)"},
    {"rule_count", t_rule_count, METH_NOARGS, "slots of the rule table that hold a rule"},
    {"resolve", t_resolve, METH_O, "dladdr of return addresses"},
    {"active", t_active, METH_NOARGS, "whether a trace is subscribed"},
    {"self_address", t_self_address, METH_NOARGS, "an address inside this module"},
    {"bench", t_bench, METH_VARARGS, "seconds for n rounds of driver calls without the GIL"},
    {"walk_stats", t_walk_stats, METH_NOARGS, "(fast walks, unwinder's walks) of this trace"},
    {"set_walker", t_set_walker, METH_O, "set_walker(unwinder_only) -> previous"},
    {"set_verify", t_set_verify, METH_O, "set_verify(on) -> previous (the tests)"},
    {"live_threads", t_live_threads, METH_NOARGS, "[((interp, thread state id), OS thread id)]"},
    {"use_find_object", t_use_find_object, METH_O, "use_find_object(on) -> previous (the tests)"},
    {"walk_mismatches", t_walk_mismatches, METH_NOARGS, "fast walks the unwinder redid differently"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cyctx._trace._native",
                                    "Native half of cyctx.trace() (see tracer.c)", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "FRAMES_SUPPORTED", CYCTX_TRACE_FRAMES) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PY", MAX_PY) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NATIVE", MAX_NATIVE) < 0 ||
        PyModule_AddIntConstant(m, "FAST_WALK", FAST_WALK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
