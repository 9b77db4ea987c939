/*
 * simcupti.c -- cyctx's simulated CUPTI: libcupti.so.13 beside the simulated libcuda.so.1.
 *
 * CUPTI's callback API (cupti_callbacks.h, the functions a callback subscriber uses) over what
 * the simulated driver reports (cupti_hook.h), with CUPTI's signatures, structures, result
 * codes (cupti_result.h) and version numbers (cupti_version.h): a CUPTI client (cyctx's tracer)
 * finds and loads it as it would NVIDIA's, and runs on it unchanged. It works with the
 * simulated driver only: with any other libcuda.so.1, or none, cuptiSubscribe answers
 * CUPTI_ERROR_NOT_INITIALIZED.
 *
 * Subscribers, as the headers of CUDA 13.0 and 13.5 describe them:
 *   - cuptiSubscribe makes a subscriber that allows no other; while any other exists it is
 *     refused with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (the H200's answer to a
 *     second subscriber, docs/evidence.md "CUPTI callbacks");
 *   - cuptiSubscribe_v2 (from 13.0) takes CUpti_SubscriberParams: a name, shown to the others
 *     as "CUPTI for <name>", and where to write the other subscriber's name when refused; from
 *     13.2 allowMultipleSubscribers too: subscribers that all allow it coexist, each getting
 *     the callbacks it enabled, and one that joins others is told the first one's name;
 *   - the structure's size is its version's: 13.0 and 13.1 take exactly 32 bytes (a larger
 *     one is CUPTI_ERROR_INVALID_PARAMETER, as libcupti 13.0.85 answers), 13.2 on 32 or 40;
 *   - cuptiGetVersion says which CUPTI this is: 13.2 (130200) unless
 *     cyctxsim_cupti_set_version makes it another: 130000 or 130100 (one subscriber, named
 *     when refused), or a number below 130000, a CUPTI before 13.0, which has no
 *     cuptiSubscribe_v2 (here it answers CUPTI_ERROR_NOT_SUPPORTED); 0: one whose
 *     cuptiGetVersion fails (CUPTI_ERROR_UNKNOWN, as libcupti 13.5 answers without a driver);
 *   - cuptiUnsubscribe disables the subscriber's callbacks and returns once no callback runs
 *     on another thread; from inside a callback it is CUPTI_ERROR_INVALID_OPERATION.
 * Seen on an H100 beside torch's profiler, a subscriber without a name: a refused request
 * that allows no other is told "CUPTI for <not provided>" (libcupti 13.0.85 and 13.5.25), one
 * that allows others is told nothing (13.5.25); a cuptiSubscribe after a subscriber that allows
 * others is refused (13.0.85 and 13.5.25).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cupti_hook.h"

#define API __attribute__((visibility("default")))

enum {                                  /* CUptiResult */
    SUCCESS = 0,
    INVALID_PARAMETER = 1,
    INVALID_OPERATION = 7,
    MAX_LIMIT_REACHED = 12,
    NOT_INITIALIZED = 15,
    NOT_SUPPORTED = 27,
    MULTIPLE_SUBSCRIBERS = 39,
    UNKNOWN = 999,
};

typedef void (*Callback)(void *userdata, int domain, uint32_t cbid, const void *data);

typedef struct {                        /* CUpti_SubscriberParams of CUDA 13.2 */
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
    uint8_t allowMultipleSubscribers;   /* from 13.2 */
    uint8_t padding[7];
} SubscriberParams;
#define SIZE_13_0 (offsetof(SubscriberParams, oldSubscriberSize) + sizeof(size_t))
#define SIZE_13_2 (offsetof(SubscriberParams, padding) + 7)
#define NAME_LEN 64                     /* "CUPTI for " + CUPTI_SUBSCRIBER_NAME_MAX_LEN + NUL */

#define N_SUBS 8
typedef struct {
    _Atomic(Callback) cb;               /* NULL while free or being removed */
    void *userdata;
    int taken;                          /* under g_lock */
    int allows_others;
    char name[NAME_LEN];
    _Atomic uint64_t enabled[CYCTXSIM_CB_DOMAINS][CYCTXSIM_CB_IDS / 64];
} Sub;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static Sub g_subs[N_SUBS];              /* a subscriber's handle is its slot's address */
static _Atomic uint32_t g_version = 130200;
static _Atomic int g_inflight;          /* callbacks running now (unsubscribe waits) */
static _Thread_local int t_in_callback;
static CyctxsimCuptiHook *_Atomic g_hook;

/* The simulated driver's callbacks, delivered to each subscriber that enabled them. */
static void fire(int domain, uint32_t cbid, const void *data) {
    atomic_fetch_add(&g_inflight, 1);
    for (int i = 0; i < N_SUBS; i++) {
        Sub *s = &g_subs[i];
        Callback cb = atomic_load(&s->cb);
        if (cb && (atomic_load(&s->enabled[domain][cbid / 64]) >> (cbid % 64) & 1)) {
            t_in_callback++;
            cb(s->userdata, domain, cbid, data);
            t_in_callback--;
        }
    }
    atomic_fetch_sub(&g_inflight, 1);
}

/* The simulated driver's hook, attached once; NULL when the loaded libcuda.so.1 is another. */
static CyctxsimCuptiHook *hook(void) {
    CyctxsimCuptiHook *h = atomic_load(&g_hook);
    if (h) return h;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CyctxsimCuptiHook *(*get)(void) =
        cuda ? (CyctxsimCuptiHook * (*)(void)) dlsym(cuda, "cyctxsim_cupti_hook") : NULL;
    h = get ? get() : NULL;
    if (cuda) dlclose(cuda);   /* it stays loaded: this handle only counted a reference */
    if (h) {
        atomic_store(&h->fire, fire);
        atomic_store(&g_hook, h);
    }
    return h;
}

/* Under g_lock: the union of the subscribers' callbacks, which the driver reads. */
static void publish_union(void) {
    CyctxsimCuptiHook *h = atomic_load(&g_hook);
    if (!h) return;
    int any = 0;
    for (int d = 0; d < CYCTXSIM_CB_DOMAINS; d++)
        for (int w = 0; w < CYCTXSIM_CB_IDS / 64; w++) {
            uint64_t bits = 0;
            for (int i = 0; i < N_SUBS; i++)
                if (g_subs[i].taken) bits |= atomic_load(&g_subs[i].enabled[d][w]);
            atomic_store(&h->enabled[d][w], bits);
            any |= bits != 0;
        }
    atomic_store(&h->any, any);
}

static Sub *sub_of(void *handle) {
    for (int i = 0; i < N_SUBS; i++)
        if (handle == &g_subs[i] && g_subs[i].taken) return &g_subs[i];
    return NULL;
}

static void tell(char *out, size_t n, const char *name) {
    if (!out || !n) return;
    snprintf(out, n, "%s", name);
}

/* A new subscriber, if the ones there let it in (see the head comment). */
static int add(void **handle, Callback cb, void *userdata, const char *name, int allows_others,
               char *old_name, size_t old_size) {
    if (!handle || !cb) return INVALID_PARAMETER;
    if (!hook()) return NOT_INITIALIZED;
    pthread_mutex_lock(&g_lock);
    Sub *first = NULL, *refusing = NULL, *free_slot = NULL;
    for (int i = 0; i < N_SUBS; i++) {
        Sub *s = &g_subs[i];
        if (!s->taken) {
            if (!free_slot) free_slot = s;
            continue;
        }
        if (!first) first = s;
        if (!s->allows_others && !refusing) refusing = s;
    }
    int r = SUCCESS;
    if (first && (!allows_others || refusing)) {
        const char *holder = (refusing ? refusing : first)->name;
        tell(old_name, old_size, holder[0] || allows_others ? holder : "CUPTI for <not provided>");
        r = MULTIPLE_SUBSCRIBERS;
    } else if (!free_slot) {
        r = MAX_LIMIT_REACHED;
    } else {
        if (first) tell(old_name, old_size, first->name);
        Sub *s = free_slot;
        memset((void *)s->enabled, 0, sizeof s->enabled);
        s->userdata = userdata;
        s->allows_others = allows_others;
        snprintf(s->name, sizeof s->name, "%s", name);
        s->taken = 1;
        atomic_store(&s->cb, cb);
        *handle = s;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

API int cuptiSubscribe(void **subscriber, Callback callback, void *userdata) {
    return add(subscriber, callback, userdata, "", 0, NULL, 0);
}

API int cuptiSubscribe_v2(void **subscriber, Callback callback, void *userdata,
                          SubscriberParams *params) {
    uint32_t version = atomic_load(&g_version);
    if (version < 130000) return NOT_SUPPORTED;
    if (!params) return add(subscriber, callback, userdata, "", 0, NULL, 0);
    int ok = params->structSize == SIZE_13_0 || (version >= 130200 && params->structSize == SIZE_13_2);
    if (!ok) return INVALID_PARAMETER;
    char name[NAME_LEN] = "";
    if (params->subscriberName) snprintf(name, sizeof name, "CUPTI for %.53s", params->subscriberName);
    int allows = params->structSize == SIZE_13_2 && params->allowMultipleSubscribers;
    return add(subscriber, callback, userdata, name, allows, params->oldSubscriberName,
               params->oldSubscriberSize);
}

/* Disables every callback of the subscriber and returns once none runs on another thread. */
API int cuptiUnsubscribe(void *subscriber) {
    if (t_in_callback) return INVALID_OPERATION;
    pthread_mutex_lock(&g_lock);
    Sub *s = sub_of(subscriber);
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        return INVALID_PARAMETER;
    }
    atomic_store(&s->cb, NULL);
    memset((void *)s->enabled, 0, sizeof s->enabled);
    publish_union();
    pthread_mutex_unlock(&g_lock);
    /* Without the lock: a callback running now may call into CUPTI. The slot stays taken
     * meanwhile, so no new subscriber reuses it under a callback that still runs. */
    while (atomic_load(&g_inflight) > 0) sched_yield();
    pthread_mutex_lock(&g_lock);
    s->taken = 0;
    publish_union();
    pthread_mutex_unlock(&g_lock);
    return SUCCESS;
}

static int valid(int domain, uint32_t cbid) {
    return domain > 0 && domain < CYCTXSIM_CB_DOMAINS && cbid > 0 && cbid < CYCTXSIM_CB_IDS;
}

API int cuptiEnableCallback(uint32_t enable, void *subscriber, int domain, uint32_t cbid) {
    int r = SUCCESS;
    pthread_mutex_lock(&g_lock);
    Sub *s = sub_of(subscriber);
    if (!s || !atomic_load(&s->cb) || !valid(domain, cbid)) {
        r = INVALID_PARAMETER;
    } else {
        uint64_t bit = (uint64_t)1 << (cbid % 64);
        if (enable) atomic_fetch_or(&s->enabled[domain][cbid / 64], bit);
        else atomic_fetch_and(&s->enabled[domain][cbid / 64], ~bit);
        publish_union();
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

API int cuptiGetCallbackState(uint32_t *enable, void *subscriber, int domain, uint32_t cbid) {
    if (!enable) return INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    Sub *s = sub_of(subscriber);
    int ok = s && valid(domain, cbid);
    if (ok) *enable = (uint32_t)(atomic_load(&s->enabled[domain][cbid / 64]) >> (cbid % 64) & 1);
    pthread_mutex_unlock(&g_lock);
    return ok ? SUCCESS : INVALID_PARAMETER;
}

API int cuptiGetVersion(uint32_t *version) {
    if (!version) return INVALID_PARAMETER;
    uint32_t v = atomic_load(&g_version);
    if (!v) return UNKNOWN;
    *version = v;
    return SUCCESS;
}

API int cuptiGetResultString(int result, const char **str) {
    if (!str) return INVALID_PARAMETER;
    switch (result) {
    case SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case INVALID_OPERATION: *str = "CUPTI_ERROR_INVALID_OPERATION"; break;
    case MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
    case NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case MULTIPLE_SUBSCRIBERS: *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; break;
    case UNKNOWN: *str = "CUPTI_ERROR_UNKNOWN"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return INVALID_PARAMETER;
    }
    return SUCCESS;
}

/* Not CUPTI's: which CUPTI this one is (its cuptiGetVersion number, see the head comment);
 * returns the one it was. For the tests. */
API uint32_t cyctxsim_cupti_set_version(uint32_t version) {
    return atomic_exchange(&g_version, version);
}

static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_release(void) { pthread_mutex_unlock(&g_lock); }

__attribute__((constructor)) static void load(void) {
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}
