/* accyd.engine._native: the native launch engine of accyd's ring doors.
 *
 * Engine threads take the records clients publish in their rings and launch those that
 * match a *ticket* -- a launch the Python core checked in full once and installed here --
 * without taking the GIL: copy the slots out (every offset checked, nothing trusted),
 * check seq, kind, flags, the ticket's epoch, the serving and device flags and the
 * in-flight counters, launch through the driver table, record one pooled event per
 * stream and batch, poll the events, publish ``tail`` and ``done``, wake a client only
 * when it said it sleeps. Every other record (first sight, binds, copies, refusals,
 * faults, anything that does not match) parks its ring and goes to Python through the
 * slow queue; Python decides, writes any error entry itself and resumes the ring.
 *
 * Ownership: the engine owns its threads, its event pools (made and destroyed through the
 * driver table), its ticket tables and flights. A ring's memory and eventfds are Python's
 * (``RingMemory``): the engine holds a buffer export of the memory from ``add_ring`` until
 * ``remove_ring`` returns, so the mapping cannot be closed under it.
 *
 * The driver table is either the CUDA driver (``libcuda.so.1`` loaded at run time, no
 * CUDA headers: the prototypes used are declared here) or function pointers the caller
 * gives (ctypes callbacks: the host backend, and the tests' fake driver).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

/* ---- the ring's layout (accy.protocol.ring; checked against it at import) ---------------- */
#define HEAD_OFF 64
#define TAIL_OFF 128
#define DONE_OFF 192
#define CLIENT_WAITS_OFF 256
#define DAEMON_WAITS_OFF 320
#define CLOSED_OFF 448
#define LEFT_OFF 456
#define HEADER_SIZE 16384
#define SLOT_SIZE 256
#define KIND_OFF 8
#define FLAGS_OFF 10
#define KEY_OFF 12
#define KEY_END 148
#define KEY_LEN (KEY_END - KEY_OFF)
#define SCALARS_OFF 84 /* the scalar values: 8 bytes each, MAX_SCALARS of them, to KEY_END */
#define MAX_SCALARS 8
#define KIND_LAUNCH 1
#define FLAG_NOTIFY 1
#define MAX_SLOTS 4096

/* ---- limits of the engine ------------------------------------------------------------ */
#define MAX_DRIVERS 16
#define MAX_THREADS 16
#define MAX_BATCH 256
#define MAX_FLIGHTS 64
#define MAX_FLIGHT_EVENTS 16
#define TICKETS_PER_RING 1024
#define TICKET_TABLE 2048 /* a power of two, twice TICKETS_PER_RING */
#define FREE_SPECS 32     /* session handles with free scalars, per ring */
#define ERR_NOT_READY 600 /* CUDA_ERROR_NOT_READY */
#define ERR_CALLBACK 999  /* a table driver's callback raised */

/* Slow items: why a ring went to Python. */
enum { SLOW_RECORD = 1, SLOW_BROKEN = 2, SLOW_LAUNCH_FAILED = 3, SLOW_FAULT = 4 };

/* ---- the driver table ---------------------------------------------------------------- */
typedef int (*launch_fn)(uint64_t exec, uint64_t stream);
typedef int (*event_create_fn)(uint64_t *event);
typedef int (*event_destroy_fn)(uint64_t event);
typedef int (*event_record_fn)(uint64_t event, uint64_t stream);
typedef int (*event_query_fn)(uint64_t event);
typedef int (*set_current_fn)(uint64_t context);
/* Give ``exec`` the values of the free scalar fields in ``mask`` from a record's scalar bytes
 * (``SCALARS_OFF`` to ``KEY_END``), for its launches from now on. */
typedef int (*patch_fn)(uint64_t exec, const uint8_t *scalars, uint32_t mask);

typedef struct {
    launch_fn launch;
    event_create_fn event_create;
    event_destroy_fn event_destroy;
    event_record_fn event_record;
    event_query_fn event_query;
    set_current_fn set_current; /* NULL: no context to make current */
    patch_fn patch;             /* NULL: its tickets never have free scalars */
    uint64_t context;
    int used;
} driver_t;

/* The CUDA driver's own prototypes, resolved with dlsym. */
typedef int (*cu_graph_launch_t)(void *exec, void *stream);
typedef int (*cu_event_create_t)(void **event, unsigned int flags);
typedef int (*cu_event_destroy_t)(void *event);
typedef int (*cu_event_record_t)(void *event, void *stream);
typedef int (*cu_event_query_t)(void *event);
typedef int (*cu_ctx_set_current_t)(void *context);
static cu_graph_launch_t cu_graph_launch;
static cu_event_create_t cu_event_create;
static cu_event_destroy_t cu_event_destroy;
static cu_event_record_t cu_event_record;
static cu_event_query_t cu_event_query;
static cu_ctx_set_current_t cu_ctx_set_current;

static int cuda_launch(uint64_t exec, uint64_t stream) {
    return cu_graph_launch((void *)(uintptr_t)exec, (void *)(uintptr_t)stream);
}
static int cuda_event_create(uint64_t *event) {
    void *handle = NULL;
    int err = cu_event_create(&handle, 2 /* CU_EVENT_DISABLE_TIMING */);
    *event = (uint64_t)(uintptr_t)handle;
    return err;
}
static int cuda_event_destroy(uint64_t event) { return cu_event_destroy((void *)(uintptr_t)event); }
static int cuda_event_record(uint64_t event, uint64_t stream) {
    return cu_event_record((void *)(uintptr_t)event, (void *)(uintptr_t)stream);
}
static int cuda_event_query(uint64_t event) { return cu_event_query((void *)(uintptr_t)event); }
static int cuda_set_current(uint64_t context) {
    return cu_ctx_set_current((void *)(uintptr_t)context);
}

static const char *load_cuda(void) {
    static void *lib;
    if (lib != NULL) return NULL;
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) return "libcuda.so.1 could not be loaded";
    cu_graph_launch = (cu_graph_launch_t)dlsym(handle, "cuGraphLaunch");
    cu_event_create = (cu_event_create_t)dlsym(handle, "cuEventCreate");
    cu_event_destroy = (cu_event_destroy_t)dlsym(handle, "cuEventDestroy_v2");
    cu_event_record = (cu_event_record_t)dlsym(handle, "cuEventRecord");
    cu_event_query = (cu_event_query_t)dlsym(handle, "cuEventQuery");
    cu_ctx_set_current = (cu_ctx_set_current_t)dlsym(handle, "cuCtxSetCurrent");
    if (!cu_graph_launch || !cu_event_create || !cu_event_destroy || !cu_event_record ||
        !cu_event_query || !cu_ctx_set_current) {
        dlclose(handle);
        return "libcuda.so.1 lacks a function the engine uses";
    }
    lib = handle;
    return NULL;
}

/* ---- tickets, flights, rings ----------------------------------------------------------- */
typedef struct {
    uint8_t key[KEY_LEN];
    uint64_t exec, stream;
    uint64_t epoch_value;
    uint32_t epoch;
    int32_t token; /* the session, for Python: counts and a fault's name */
    uint8_t driver;
    uint8_t used;
    uint8_t masked; /* its key has its session's free scalar fields zeroed (see free_spec_t) */
} ticket_t;

/* One session handle's free scalars in a ring: fields whose values no check reads beyond
 * their dtype's. Its tickets are keyed with those fields zeroed, so a record matches
 * whatever values it carries there; before a launch the driver's ``patch`` gives the exec
 * the record's values, unless it was the last exec given exactly these here. A float's
 * value must be finite (exponent bits not all set), else the record goes to Python, which
 * refuses it. Owned by the ring's worker thread. */
typedef struct {
    uint32_t handle;
    uint8_t mask;                    /* bit i: scalar field i is free */
    uint8_t width[MAX_SCALARS];      /* a free field's value bytes: 1, 2, 4 or 8 */
    uint64_t nonfinite[MAX_SCALARS]; /* a float's exponent bits; 0 for an integer */
    uint64_t set_exec;               /* the exec last patched here (0: none known) */
    uint8_t set[MAX_SCALARS * 8];    /* and the scalar bytes it was given */
} free_spec_t;

typedef struct {
    uint64_t event, stream;
    int32_t token;
    uint8_t driver;
} flight_event_t;

typedef struct {
    uint64_t end;      /* done may pass to this once the flight is over */
    int64_t charged;   /* launches charged to the ring's counters */
    int events, polled;
    flight_event_t ev[MAX_FLIGHT_EVENTS];
} flight_t;

typedef struct engine engine_t;
typedef struct worker worker_t;

/* What a worker counts (and with ``timings`` times): its driver calls and client wakes. */
enum { CALL_LAUNCH, CALL_RECORD, CALL_QUERY, CALL_QUERY_READY, CALL_WAKE, CALL_PATCH, CALL_KINDS };
static const char *const CALL_NAMES[CALL_KINDS] = {"launch", "record", "query", "query_ready",
                                                   "wake", "patch"};

typedef struct ring {
    int64_t id;
    uint8_t *mem;
    Py_ssize_t size;
    uint32_t slots;
    int submit_fd, complete_fd;
    int notify_always; /* a ring carried over a stream: wake its reader whenever it moves */
    int device;        /* served by the device launcher: take only the records it left */
    uint32_t counters[2]; /* the client's and the tenant's in-flight counters */
    Py_buffer view;
    /* owned by its worker thread from here on */
    uint64_t tail, done;
    int parked, broken, fault_pending, active;
    int held; /* done waits: a record's failure is Python's to write first (until resumed) */
    uint64_t idle_since;
    ticket_t *tickets;
    uint32_t ticket_count;
    free_spec_t *specs; /* FREE_SPECS of them once one is put */
    int nspecs;
    flight_t flights[MAX_FLIGHTS];
    int fhead, fcount;
    worker_t *owner; /* set once, when added */
    int attached;    /* on its owner's list (the owner's own flag) */
    atomic_int touched;
    struct ring *next_active;
} ring_t;

/* Commands from Python, applied by the owning thread between rounds. */
enum { CMD_ADD = 1, CMD_REMOVE, CMD_RESUME, CMD_FAULT_DONE, CMD_BARRIER, CMD_DEVICE };
typedef struct command {
    int kind;
    ring_t *ring;
    uint64_t tail;
    int clear; /* CMD_RESUME: drop the ring's tickets; CMD_DEVICE: to the device (else back) */
    int nstreams;
    flight_event_t *streams; /* CMD_RESUME: where the handled records' completion is */
    int ntickets;
    ticket_t *tickets;
    free_spec_t *specs; /* CMD_RESUME: per ticket, its handle's free scalars (mask 0: none) */
    atomic_int *done;
    struct command *next;
} command_t;

typedef struct slow_item {
    int kind;
    int64_t ring;
    uint64_t seq;
    int code;
    int32_t token;
    struct slow_item *next;
} slow_item_t;

struct worker {
    engine_t *engine;
    int index;
    pthread_t thread;
    int started;
    int epoll_fd, wake_fd;
    pthread_mutex_t lock; /* guards commands */
    command_t *commands, *commands_last;
    ring_t **rings;
    int nrings, cap_rings;
    int assigned; /* rings given to this worker and not removed (under the engine's rings_lock) */
    ring_t *active;
    int nactive;
    uint64_t *pool[MAX_DRIVERS]; /* pooled events, per driver */
    int pooled[MAX_DRIVERS], pool_cap[MAX_DRIVERS];
    pthread_mutex_t serving; /* held by the thread running this lane's round (see lanes_of) */
    uint64_t last_scan;      /* when its inactive rings' heads were last looked at */
    atomic_uint_fast64_t round;
    /* stats */
    atomic_uint_fast64_t fast, slow, launches, rounds, sleeps;
    atomic_uint_fast64_t calls[CALL_KINDS], call_ns[CALL_KINDS]; /* ns: with ``timings`` */
};

struct engine {
    PyObject_HEAD
    int timings; /* time every driver call and wake (two clock reads each) */
    driver_t drivers[MAX_DRIVERS];
    int nworkers;
    worker_t workers[MAX_THREADS];
    int batch;
    uint64_t spin_ns, flight_spin_ns, idle_poll_ns;
    atomic_int stopping;
    atomic_int serving;
    atomic_uint_fast64_t device_ok; /* a bit per driver */
    _Atomic uint64_t *epochs;
    uint32_t nepochs;
    _Atomic int64_t *counts;   /* [n][3]: engine's own, Python's (external), limit (-1: none) */
    uint32_t ncounters;
    _Atomic int64_t *launched; /* per session token, since Python last looked */
    uint32_t ntokens;
    pthread_mutex_t slow_lock;
    pthread_cond_t slow_cond;
    slow_item_t *slow_head, *slow_tail;
    int slow_fd; /* eventfd: readable when slow items wait */
    pthread_mutex_t rings_lock; /* guards rings_by_id */
    ring_t **rings_by_id;
    int nrings_by_id, cap_rings_by_id;
    int base;                 /* the threads that always run (see lanes_of) */
    atomic_int crowded;       /* Python's word: more clients wait than fit on the CPUs */
    atomic_int pipelined;     /* the last judgement of the clients' use (see judge_use) */
    atomic_int spread;        /* crowded and not pipelined: the others run their own lanes */
    pthread_mutex_t crowd_lock; /* guards changes of the three */
    pthread_cond_t crowd_cond; /* signalled as ``spread`` changes and at stop */
    uint64_t judged_at, judged_launches, judged_wakes; /* thread 0's, for judge_use */
    int started;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_REALTIME ``ns`` from now: a deadline for pthread_cond_timedwait. */
static struct timespec realtime_after(uint64_t ns) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(ns / 1000000000ull);
    until.tv_nsec += (long)(ns % 1000000000ull);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    return until;
}

/* A call of some CALL_ kind begins (0 unless the engine times its calls) and ends. */
static inline uint64_t call_began(const worker_t *w) { return w->engine->timings ? now_ns() : 0; }
static inline void call_ended(worker_t *w, int kind, uint64_t began) {
    atomic_fetch_add_explicit(&w->calls[kind], 1, memory_order_relaxed);
    if (began) atomic_fetch_add_explicit(&w->call_ns[kind], now_ns() - began, memory_order_relaxed);
}

/* Counters in the ring's memory: aligned words, one load or store each. */
static inline uint64_t ring_load64(const ring_t *r, size_t off) {
    return atomic_load_explicit((_Atomic uint64_t *)(r->mem + off), memory_order_acquire);
}
static inline void ring_store64(ring_t *r, size_t off, uint64_t value) {
    atomic_store_explicit((_Atomic uint64_t *)(r->mem + off), value, memory_order_release);
}
static inline uint32_t ring_load32(const ring_t *r, size_t off) {
    return atomic_load_explicit((_Atomic uint32_t *)(r->mem + off), memory_order_acquire);
}
static inline void ring_store32(ring_t *r, size_t off, uint32_t value) {
    atomic_store_explicit((_Atomic uint32_t *)(r->mem + off), value, memory_order_seq_cst);
}

static void wake_fd(int fd) {
    uint64_t one = 1;
    ssize_t ignored = write(fd, &one, sizeof one); /* a full counter is the reader's problem */
    (void)ignored;
}

static void drain_fd(int fd) {
    uint64_t value;
    ssize_t ignored = read(fd, &value, sizeof value);
    (void)ignored;
}

/* ---- the ticket table (open addressing, keyed by a record's launch bytes) --------------- */
static uint32_t key_hash(const uint8_t *key) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over 64-bit words */
    for (int i = 0; i < KEY_LEN; i += 8) {
        uint64_t word;
        memcpy(&word, key + i, 8);
        h = (h ^ word) * 1099511628211ull;
        h ^= h >> 29;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static ticket_t *ticket_find(ring_t *r, const uint8_t *key) {
    if (r->tickets == NULL || r->ticket_count == 0) return NULL;
    uint32_t at = key_hash(key) & (TICKET_TABLE - 1);
    for (uint32_t probe = 0; probe < TICKET_TABLE; probe++) {
        ticket_t *t = &r->tickets[(at + probe) & (TICKET_TABLE - 1)];
        if (!t->used) return NULL;
        if (memcmp(t->key, key, KEY_LEN) == 0) return t;
    }
    return NULL;
}

static void tickets_clear(ring_t *r) {
    if (r->tickets != NULL) memset(r->tickets, 0, sizeof(ticket_t) * TICKET_TABLE);
    r->ticket_count = 0;
}

/* Every ticket and free spec of the ring dropped: its handles may name other sessions now. */
static void handles_clear(ring_t *r) {
    tickets_clear(r);
    r->nspecs = 0;
}

/* ---- free scalars (see free_spec_t) ------------------------------------------------------ */
static free_spec_t *spec_find(ring_t *r, uint32_t handle) {
    for (int k = 0; k < r->nspecs; k++)
        if (r->specs[k].handle == handle) return &r->specs[k];
    return NULL;
}

static int spec_same_rules(const free_spec_t *a, const free_spec_t *b) {
    return a->mask == b->mask && memcmp(a->width, b->width, sizeof a->width) == 0 &&
           memcmp(a->nonfinite, b->nonfinite, sizeof a->nonfinite) == 0;
}

/* Put ``spec`` for its handle; -1 when the ring has no room (its ticket is then left out).
 * Rules unlike the handle's present ones (never, while a handle stays bound: Python clears
 * the tickets as it unbinds) drop every ticket and spec of the ring first. */
static int spec_put(ring_t *r, const free_spec_t *spec) {
    if (r->specs == NULL) {
        r->specs = calloc(FREE_SPECS, sizeof(free_spec_t));
        if (r->specs == NULL) return -1;
    }
    free_spec_t *old = spec_find(r, spec->handle);
    if (old != NULL && spec_same_rules(old, spec)) return 0;
    if (old != NULL) handles_clear(r);
    if (r->nspecs == FREE_SPECS) return -1;
    r->specs[r->nspecs] = *spec;
    r->specs[r->nspecs].set_exec = 0;
    r->nspecs++;
    return 0;
}

/* Whether every free float field of ``scalars`` holds a finite value. */
static int spec_values_ok(const free_spec_t *s, const uint8_t *scalars) {
    for (int i = 0; i < MAX_SCALARS; i++) {
        if (!(s->mask & (1u << i)) || s->nonfinite[i] == 0) continue;
        uint64_t value = 0;
        memcpy(&value, scalars + 8 * i, s->width[i]); /* little-endian, as the record */
        if ((value & s->nonfinite[i]) == s->nonfinite[i]) return 0;
    }
    return 1;
}

/* ``key`` (KEY_LEN bytes, a copy) with the spec's free fields zeroed. */
static void spec_mask_key(const free_spec_t *s, uint8_t *key) {
    for (int i = 0; i < MAX_SCALARS; i++)
        if (s->mask & (1u << i)) memset(key + (SCALARS_OFF - KEY_OFF) + 8 * i, 0, 8);
}

/* Whether ``exec`` may hold other values than ``scalars``' free fields here. */
static int spec_stale(const free_spec_t *s, uint64_t exec, const uint8_t *scalars) {
    if (s->set_exec != exec) return 1;
    for (int i = 0; i < MAX_SCALARS; i++)
        if ((s->mask & (1u << i)) && memcmp(s->set + 8 * i, scalars + 8 * i, s->width[i]) != 0)
            return 1;
    return 0;
}

static int ticket_put(ring_t *r, const ticket_t *ticket) {
    if (r->tickets == NULL) {
        r->tickets = calloc(TICKET_TABLE, sizeof(ticket_t));
        if (r->tickets == NULL) return -1;
    }
    ticket_t *old = ticket_find(r, ticket->key);
    if (old != NULL) {
        *old = *ticket;
        old->used = 1;
        return 0;
    }
    if (r->ticket_count >= TICKETS_PER_RING) tickets_clear(r); /* past the bound: start over */
    uint32_t at = key_hash(ticket->key) & (TICKET_TABLE - 1);
    for (uint32_t probe = 0; probe < TICKET_TABLE; probe++) {
        ticket_t *t = &r->tickets[(at + probe) & (TICKET_TABLE - 1)];
        if (!t->used) {
            *t = *ticket;
            t->used = 1;
            r->ticket_count++;
            return 0;
        }
    }
    return -1;
}

/* ---- slow queue ------------------------------------------------------------------------- */
static void slow_push(engine_t *e, int kind, ring_t *r, uint64_t seq, int code, int32_t token) {
    slow_item_t *item = calloc(1, sizeof *item);
    if (item == NULL) return; /* out of memory: the ring stays parked; Python sees it stall */
    item->kind = kind;
    item->ring = r->id;
    item->seq = seq;
    item->code = code;
    item->token = token;
    pthread_mutex_lock(&e->slow_lock);
    if (e->slow_tail) e->slow_tail->next = item;
    else e->slow_head = item;
    e->slow_tail = item;
    pthread_cond_signal(&e->slow_cond);
    pthread_mutex_unlock(&e->slow_lock);
    wake_fd(e->slow_fd);
}

/* ---- events ----------------------------------------------------------------------------- */
static int event_take(worker_t *w, int driver, uint64_t *event) {
    if (w->pooled[driver] > 0) {
        *event = w->pool[driver][--w->pooled[driver]];
        return 0;
    }
    return w->engine->drivers[driver].event_create(event);
}

static void event_give(worker_t *w, int driver, uint64_t event) {
    if (w->pooled[driver] == w->pool_cap[driver]) {
        int cap = w->pool_cap[driver] ? w->pool_cap[driver] * 2 : 64;
        if (cap > 4096) {
            w->engine->drivers[driver].event_destroy(event);
            return;
        }
        uint64_t *grown = realloc(w->pool[driver], sizeof(uint64_t) * (size_t)cap);
        if (grown == NULL) {
            w->engine->drivers[driver].event_destroy(event);
            return;
        }
        w->pool[driver] = grown;
        w->pool_cap[driver] = cap;
    }
    w->pool[driver][w->pooled[driver]++] = event;
}

/* The context current on this thread: a thread may serve several lanes. */
static _Thread_local uint64_t current_context;

static int make_current(worker_t *w, int driver) {
    driver_t *d = &w->engine->drivers[driver];
    if (d->set_current == NULL || current_context == d->context) return 0;
    int err = d->set_current(d->context);
    if (err == 0) current_context = d->context;
    return err;
}

/* ---- counters --------------------------------------------------------------------------- */
static inline _Atomic int64_t *counter(engine_t *e, uint32_t index) { return &e->counts[index * 3]; }

/* How many of ``n`` more launches fit a counter's limit, counting Python's own too. */
static int64_t counter_room(engine_t *e, uint32_t index, int64_t n) {
    if (index >= e->ncounters) return n;
    _Atomic int64_t *c = counter(e, index);
    int64_t limit = atomic_load_explicit(&c[2], memory_order_relaxed);
    if (limit < 0) return n;
    int64_t have = atomic_load_explicit(&c[0], memory_order_relaxed) +
                   atomic_load_explicit(&c[1], memory_order_relaxed);
    int64_t room = limit - have;
    return room < 0 ? 0 : (room < n ? room : n);
}

static void counter_add(engine_t *e, uint32_t index, int64_t n) {
    if (index < e->ncounters) atomic_fetch_add_explicit(&counter(e, index)[0], n, memory_order_relaxed);
}

/* ---- taking records ---------------------------------------------------------------------- */
static int flight_add_stream(flight_t *f, int driver, uint64_t stream, int32_t token) {
    for (int i = 0; i < f->events; i++)
        if (f->ev[i].stream == stream && f->ev[i].driver == driver) return 1;
    if (f->events == MAX_FLIGHT_EVENTS) return 0;
    f->ev[f->events].stream = stream;
    f->ev[f->events].driver = (uint8_t)driver;
    f->ev[f->events].token = token;
    f->ev[f->events].event = 0;
    f->events++;
    return 1;
}

/* Record one event per stream of a new flight; 0, or the first error (the flight is then
 * dropped: its launches are reported as a launch failure). */
static int flight_record(worker_t *w, flight_t *f, int *failed_at) {
    for (int i = 0; i < f->events; i++) {
        int driver = f->ev[i].driver;
        int err = make_current(w, driver);
        if (err == 0) err = event_take(w, driver, &f->ev[i].event);
        if (err == 0) {
            uint64_t began = call_began(w);
            err = w->engine->drivers[driver].event_record(f->ev[i].event, f->ev[i].stream);
            call_ended(w, CALL_RECORD, began);
        }
        if (err != 0) {
            *failed_at = i;
            return err;
        }
    }
    return 0;
}

static void publish_tail(ring_t *r) {
    uint64_t told = ring_load64(r, TAIL_OFF);
    ring_store64(r, TAIL_OFF, r->tail);
    if (r->notify_always && told != r->tail) wake_fd(r->complete_fd);
}

/* Push ``f`` as the ring's newest flight (events recorded) and charge it. */
static void flight_push(ring_t *r, const flight_t *f) {
    int at = (r->fhead + r->fcount) % MAX_FLIGHTS;
    r->flights[at] = *f;
    r->fcount++;
}

static void give_events(worker_t *w, flight_t *f, int count) {
    for (int i = 0; i < count; i++)
        if (f->ev[i].event) event_give(w, f->ev[i].driver, f->ev[i].event);
}

/* Take what a ring published: launch a run of records matching live tickets, park at the
 * first that does not. Returns whether anything moved. */
/* A device-served ring's one record the launcher left to this path (``left`` is its seq + 1),
 * or 0. The launcher leaves record seq only once every record before it is over (``done`` is
 * seq), so the records between the tail and it were the device's: the tail moves up to it. */
/* A device-served ring whose client broke the rules: its head more than a ring past ``done``
 * (its window), or a ``left`` past its head (not the GPU's doing). */
static int device_ring_broken(ring_t *r) {
    uint64_t head = ring_load64(r, HEAD_OFF);
    return head - ring_load64(r, DONE_OFF) > r->slots || ring_load64(r, LEFT_OFF) > head;
}

static uint64_t device_left(engine_t *e, ring_t *r) {
    if (device_ring_broken(r)) {
        r->broken = 1;
        slow_push(e, SLOW_BROKEN, r, r->tail, 0, -1);
        return 0;
    }
    uint64_t left = ring_load64(r, LEFT_OFF);
    if (left == 0 || left - 1 < r->tail) return 0; /* nothing left, or taken already */
    if (left - 1 > r->tail) {
        if (r->fcount > 0) return 0; /* ours are still in flight: the client wrote ``left`` */
        r->tail = r->done = left - 1;
        publish_tail(r);
    }
    return left;
}

static int ring_take(worker_t *w, ring_t *r, uint8_t *copy) {
    engine_t *e = w->engine;
    if (r->parked || r->broken || r->fcount >= MAX_FLIGHTS - 1) return 0; /* room for a resume */
    /* A device-served ring's head, for this path, is just past the record left to it. */
    uint64_t head = r->device ? device_left(e, r) : ring_load64(r, HEAD_OFF);
    if (r->device && head == 0) return 0;
    uint64_t ahead = head - r->tail;
    if (ahead == 0) return 0;
    atomic_store_explicit(&r->touched, 1, memory_order_relaxed);
    if (ahead > r->slots) { /* the client broke the ring's rules: Python closes it */
        r->broken = 1;
        slow_push(e, SLOW_BROKEN, r, r->tail, 0, -1);
        return 1;
    }
    uint32_t n = ahead < (uint64_t)e->batch ? (uint32_t)ahead : (uint32_t)e->batch;
    /* Copy the slots out first: the client may write them while we look. */
    uint32_t first = (uint32_t)(r->tail & (r->slots - 1));
    uint32_t fits = r->slots - first < n ? r->slots - first : n;
    memcpy(copy, r->mem + HEADER_SIZE + (size_t)first * SLOT_SIZE, (size_t)fits * SLOT_SIZE);
    if (fits < n) memcpy(copy + (size_t)fits * SLOT_SIZE, r->mem + HEADER_SIZE, (size_t)(n - fits) * SLOT_SIZE);

    flight_t f;
    f.end = 0;
    f.charged = 0;
    f.events = 0;
    f.polled = 0;
    uint32_t i = 0;
    int park = 0, failed = 0, fail_code = 0;
    int32_t fail_token = -1;
    int serving = atomic_load_explicit(&e->serving, memory_order_acquire);
    uint64_t ok_mask = atomic_load_explicit(&e->device_ok, memory_order_acquire);
    while (i < n) {
        const uint8_t *rec = copy + (size_t)i * SLOT_SIZE;
        uint64_t seq;
        uint16_t kind, flags;
        memcpy(&seq, rec, 8);
        memcpy(&kind, rec + KIND_OFF, 2);
        memcpy(&flags, rec + FLAGS_OFF, 2);
        ticket_t *t = NULL;
        free_spec_t *spec = NULL;
        if (seq == r->tail + i && kind == KIND_LAUNCH && (flags & ~FLAG_NOTIFY) == 0 && serving) {
            uint32_t handle;
            memcpy(&handle, rec + KEY_OFF, 4);
            spec = r->nspecs > 0 ? spec_find(r, handle) : NULL;
            if (spec == NULL) {
                t = ticket_find(r, rec + KEY_OFF);
                if (t != NULL && t->masked) t = NULL;
            } else if (spec_values_ok(spec, rec + SCALARS_OFF)) {
                uint8_t masked[KEY_LEN];
                memcpy(masked, rec + KEY_OFF, KEY_LEN);
                spec_mask_key(spec, masked);
                t = ticket_find(r, masked);
                if (t != NULL && (!t->masked || e->drivers[t->driver].patch == NULL)) t = NULL;
            }
        }
        if (t != NULL && (t->epoch >= e->nepochs ||
                          atomic_load_explicit(&e->epochs[t->epoch], memory_order_seq_cst) !=
                              t->epoch_value ||
                          !(ok_mask & (1ull << t->driver))))
            t = NULL;
        if (t == NULL) {
            park = 1;
            break;
        }
        uint32_t run = 1;
        while (i + run < n) {
            const uint8_t *next = copy + (size_t)(i + run) * SLOT_SIZE;
            uint64_t next_seq;
            uint16_t next_kind, next_flags;
            memcpy(&next_seq, next, 8);
            memcpy(&next_kind, next + KIND_OFF, 2);
            memcpy(&next_flags, next + FLAGS_OFF, 2);
            if (next_seq != r->tail + i + run || next_kind != KIND_LAUNCH ||
                (next_flags & ~FLAG_NOTIFY) != 0 || memcmp(next + KEY_OFF, rec + KEY_OFF, KEY_LEN) != 0)
                break;
            run++;
        }
        int64_t room = counter_room(e, r->counters[1], counter_room(e, r->counters[0], run));
        if (room == 0) {
            park = 1; /* Python refuses it, naming the quota */
            break;
        }
        int cut = room < run;
        run = (uint32_t)room;
        if (!flight_add_stream(&f, t->driver, t->stream, t->token)) break; /* next batch */
        int err = make_current(w, t->driver);
        uint32_t launched = 0;
        fail_token = t->token;
        if (err == 0 && spec != NULL && spec_stale(spec, t->exec, rec + SCALARS_OFF)) {
            /* the run's records carry the same values: one patch serves them all */
            uint64_t began = call_began(w);
            err = e->drivers[t->driver].patch(t->exec, rec + SCALARS_OFF, spec->mask);
            call_ended(w, CALL_PATCH, began);
            spec->set_exec = err == 0 ? t->exec : 0;
            if (err == 0) memcpy(spec->set, rec + SCALARS_OFF, sizeof spec->set);
        }
        while (err == 0 && launched < run) {
            uint64_t began = call_began(w);
            err = e->drivers[t->driver].launch(t->exec, t->stream);
            call_ended(w, CALL_LAUNCH, began);
            if (err == 0) launched++;
        }
        counter_add(e, r->counters[0], launched);
        counter_add(e, r->counters[1], launched);
        f.charged += launched;
        if (t->token >= 0 && (uint32_t)t->token < e->ntokens)
            atomic_fetch_add_explicit(&e->launched[t->token], (int64_t)launched, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->launches, launched, memory_order_relaxed);
        i += launched;
        if (err != 0) {
            failed = 1;
            fail_code = err;
            break;
        }
        if (cut) { /* the rest of the run would pass a limit: Python refuses it */
            park = 1;
            break;
        }
    }
    if (i > 0) {
        f.end = r->tail + i;
        int at = 0;
        int err = flight_record(w, &f, &at);
        if (err != 0) { /* the device is failing: done waits for the events recorded so far */
            f.events = at;
            r->tail += i;
            flight_push(r, &f);
            r->parked = 1;
            r->held = 1;
            publish_tail(r);
            slow_push(e, SLOW_LAUNCH_FAILED, r, r->tail - 1, err, f.ev[at].token);
            return 1;
        }
        r->tail += i;
        flight_push(r, &f);
        atomic_fetch_add_explicit(&w->fast, i, memory_order_relaxed);
    }
    if (failed) { /* the record at tail failed to launch: Python writes its entry */
        r->parked = 1;
        publish_tail(r);
        slow_push(e, SLOW_LAUNCH_FAILED, r, r->tail, fail_code, fail_token);
        return 1;
    }
    if (park) {
        r->parked = 1;
        publish_tail(r);
        atomic_fetch_add_explicit(&w->slow, 1, memory_order_relaxed);
        slow_push(e, SLOW_RECORD, r, r->tail, 0, -1);
        return 1;
    }
    publish_tail(r);
    return i > 0;
}

/* Advance ``done`` past finished flights; a failed event goes to Python (which writes the
 * entry first) and the ring waits for its word. Returns whether anything moved. */
static int ring_settle(worker_t *w, ring_t *r) {
    engine_t *e = w->engine;
    int moved = 0;
    while (r->fcount > 0 && !r->fault_pending && !r->held) {
        flight_t *f = &r->flights[r->fhead];
        while (f->polled < f->events) {
            flight_event_t *ev = &f->ev[f->polled];
            int err = make_current(w, ev->driver);
            if (err == 0) {
                uint64_t began = call_began(w);
                err = e->drivers[ev->driver].event_query(ev->event);
                call_ended(w, err == 0 ? CALL_QUERY_READY : CALL_QUERY, began);
            }
            if (err == ERR_NOT_READY) goto out;
            if (err != 0) {
                r->fault_pending = 1;
                f->polled++; /* reported once */
                slow_push(e, SLOW_FAULT, r, f->end - 1, err, ev->token);
                goto out;
            }
            f->polled++;
        }
        give_events(w, f, f->events);
        counter_add(e, r->counters[0], -f->charged);
        counter_add(e, r->counters[1], -f->charged);
        r->done = f->end;
        r->fhead = (r->fhead + 1) % MAX_FLIGHTS;
        r->fcount--;
        moved = 1;
    }
out:
    if (moved) {
        ring_store64(r, DONE_OFF, r->done);
        if (r->notify_always || ring_load32(r, CLIENT_WAITS_OFF)) {
            uint64_t began = call_began(w);
            wake_fd(r->complete_fd);
            call_ended(w, CALL_WAKE, began);
        }
    }
    return moved;
}

/* ---- the worker thread -------------------------------------------------------------------- */
static void activate(worker_t *w, ring_t *r) {
    if (r->active) return;
    r->active = 1;
    w->nactive++;
    r->idle_since = 0;
    ring_store32(r, DAEMON_WAITS_OFF, 0);
    r->next_active = w->active;
    w->active = r;
}

/* Whether the ring has records for this path to take (a device-served ring: one left to it). */
static int ring_has_input(ring_t *r) {
    if (r->device) {
        uint64_t left = ring_load64(r, LEFT_OFF);
        return (left != 0 && left - 1 >= r->tail) || device_ring_broken(r);
    }
    return ring_load64(r, HEAD_OFF) != r->tail;
}

static int ring_has_work(ring_t *r) {
    return r->fcount > 0 || (!r->parked && !r->broken && ring_has_input(r));
}

static void apply_commands(worker_t *w);

static void drop_ring(worker_t *w, ring_t *r) {
    for (int k = 0; k < r->fcount; k++) { /* their ends are no longer anyone's to see */
        flight_t *f = &r->flights[(r->fhead + k) % MAX_FLIGHTS];
        counter_add(w->engine, r->counters[0], -f->charged);
        counter_add(w->engine, r->counters[1], -f->charged);
        give_events(w, f, f->events);
    }
    r->fcount = 0;
    epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, r->submit_fd, NULL);
    ring_t **link = &w->active;
    while (*link) {
        if (*link == r) {
            *link = r->next_active;
            w->nactive--;
            break;
        }
        link = &(*link)->next_active;
    }
    r->active = 0;
    for (int k = 0; k < w->nrings; k++)
        if (w->rings[k] == r) {
            w->rings[k] = w->rings[--w->nrings];
            break;
        }
    free(r->tickets);
    r->tickets = NULL;
    free(r->specs);
    r->specs = NULL;
    r->nspecs = 0;
    r->attached = 0;
}

static void apply_commands(worker_t *w) {
    pthread_mutex_lock(&w->lock);
    command_t *c = w->commands;
    w->commands = w->commands_last = NULL;
    pthread_mutex_unlock(&w->lock);
    while (c) {
        command_t *next = c->next;
        ring_t *r = c->ring;
        if (c->kind == CMD_ADD) {
            if (w->nrings == w->cap_rings) {
                int cap = w->cap_rings ? w->cap_rings * 2 : 16;
                ring_t **grown = realloc(w->rings, sizeof(ring_t *) * (size_t)cap);
                if (grown) {
                    w->rings = grown;
                    w->cap_rings = cap;
                }
            }
            if (w->nrings < w->cap_rings) {
                w->rings[w->nrings++] = r;
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = r};
                epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, r->submit_fd, &ev);
                r->attached = 1;
                activate(w, r);
            }
        } else if (c->kind == CMD_REMOVE) {
            drop_ring(w, r);
        } else if (c->kind == CMD_RESUME && r->attached) {
            r->held = 0; /* Python's word on the records up to here is written */
            if (c->clear) handles_clear(r);
            /* Python may have given any exec new values meanwhile: patch before each next. */
            for (int k = 0; k < r->nspecs; k++) r->specs[k].set_exec = 0;
            for (int k = 0; k < c->ntickets; k++)
                if (!c->tickets[k].masked || spec_put(r, &c->specs[k]) == 0)
                    ticket_put(r, &c->tickets[k]);
            if (c->tail > r->tail) {
                flight_t f;
                memset(&f, 0, sizeof f);
                for (int k = 0; k < c->nstreams && k < MAX_FLIGHT_EVENTS; k++)
                    flight_add_stream(&f, c->streams[k].driver, c->streams[k].stream, c->streams[k].token);
                f.end = c->tail;
                int at = 0;
                int err = flight_record(w, &f, &at);
                if (err != 0) f.events = at; /* done waits for the events recorded so far */
                flight_push(r, &f);
                r->tail = c->tail;
                publish_tail(r);
                if (err != 0) { /* the device failed the record Python launched: it says so */
                    r->held = 1;
                    slow_push(w->engine, SLOW_LAUNCH_FAILED, r, c->tail - 1, err, f.ev[at].token);
                    goto applied; /* stays parked until Python's word */
                }
            }
            r->parked = 0;
            activate(w, r);
        } else if (c->kind == CMD_FAULT_DONE && r->attached) {
            r->fault_pending = 0;
            activate(w, r);
        } else if (c->kind == CMD_DEVICE && r->attached) {
            if (c->clear && (r->parked || r->held || r->fault_pending || r->broken ||
                             r->fcount > 0)) {
                /* To the device only when quiet: nothing of ours in flight or with Python,
                 * so every record before the tail is over and the launcher may go on from
                 * there. Python asks again later. */
                if (c->done) atomic_store_explicit(c->done, 2, memory_order_release);
                c->done = NULL;
            } else {
                if (!c->clear) { /* back from the device, which Python stopped and drained */
                    uint64_t done = ring_load64(r, DONE_OFF);
                    if (r->fcount == 0 && done > r->tail) { /* what the device took is over */
                        r->tail = r->done = done;
                        publish_tail(r);
                    }
                }
                r->device = c->clear; /* to the device: from now on only what it leaves */
                activate(w, r);
            }
        }
    applied:
        if (c->done) atomic_store_explicit(c->done, 1, memory_order_release);
        free(c->streams);
        free(c->tickets);
        free(c->specs);
        free(c);
        c = next;
    }
}

/* Take the kicks that came (a client that saw its ring off the active list wrote its submit
 * eventfd): those rings go back on the list. */
static void take_kicks(worker_t *w) {
    struct epoll_event events[64];
    int n = epoll_wait(w->epoll_fd, events, 64, 0);
    for (int k = 0; k < n; k++) {
        void *tag = events[k].data.ptr;
        worker_t *lanes = w->engine->workers;
        if (tag >= (void *)lanes && tag < (void *)(lanes + MAX_THREADS)) {
            continue; /* a lane this thread serves too: its own kicks are taken in its round */
        } else if (tag == NULL) {
            drain_fd(w->wake_fd);
        } else {
            ring_t *r = events[k].data.ptr;
            drain_fd(r->submit_fd);
            activate(w, r);
        }
    }
}

/* Rings off the active list that have work anyway: a record published just as its ring went
 * off the list (the client may not have seen the flag in time to kick). */
static void scan_inactive(worker_t *w) {
    for (int k = 0; k < w->nrings; k++)
        if (!w->rings[k]->active && ring_has_work(w->rings[k])) activate(w, w->rings[k]);
}

#define FLIGHT_POLL_MAX_NS 50000
#define TIMER_SLACK_NS 1000UL

/* ---- lanes and the threads that serve them -------------------------------------------------
 * A worker_t is a lane: rings, commands, event pools, an epoll set. Each lane has a thread
 * of its own; the first ``base`` threads always run, and while the engine is not crowded
 * thread k (k < base) also serves the lanes base + k, 2 base + k, ..., whose own threads
 * wait for a crowd. A lane's round runs under its ``serving`` lock: one thread at a time,
 * so a lane's state stays one thread's, as if it had only its own. Rings go to the lane
 * holding the fewest, so a crowd's rings are spread over every thread without moving.
 *
 * Only a crowd that waits for its launches gets every thread (``spread``): each waited
 * launch is a round trip, and more threads overlap more of them (32 clients waiting for
 * each short launch: 1.13-1.5x on 8 threads against 4). A crowd that pipelines wants few
 * threads: the driver serializes a process's launches, each thread added makes every
 * launch dearer, and its clients already keep the GPU fed (32 clients waiting every 16th:
 * 294-396k/s on 8 threads against 434-567k on 4). Thread 0 tells the two apart by the
 * launches per client woken (a crowd's clients sleep in every wait). */
#define JUDGE_NS 50000000ull
#define JUDGE_MIN_LAUNCHES 64
#define PIPELINED_LAUNCHES_PER_WAKE 4

/* ``spread`` anew from ``crowded`` and ``pipelined`` (under crowd_lock); whether it changed.
 * The threads past ``base`` hear it at once; those below, their next round. */
static int update_spread(engine_t *e) {
    int spread = atomic_load(&e->crowded) && !atomic_load(&e->pipelined);
    if (spread == atomic_load(&e->spread)) return 0;
    atomic_store(&e->spread, spread);
    pthread_cond_broadcast(&e->crowd_cond);
    return 1;
}

static void wake_base(engine_t *e) {
    for (int k = 0; k < e->base; k++) wake_fd(e->workers[k].wake_fd); /* re-nest at once */
}

/* Thread 0, every JUDGE_NS: whether the clients pipeline (more than
 * PIPELINED_LAUNCHES_PER_WAKE launches per client woken since the last judgement). Until
 * JUDGE_MIN_LAUNCHES more launches tell, the last judgement stands: the counts since it go
 * on adding up, and are summed again JUDGE_NS later (not every round of a quiet engine). */
static void judge_use(engine_t *e, uint64_t now) {
    if (now - e->judged_at < JUDGE_NS) return;
    e->judged_at = now;
    uint64_t launches = 0, wakes = 0;
    for (int k = 0; k < e->nworkers; k++) {
        launches += atomic_load_explicit(&e->workers[k].launches, memory_order_relaxed);
        wakes += atomic_load_explicit(&e->workers[k].calls[CALL_WAKE], memory_order_relaxed);
    }
    uint64_t launched = launches - e->judged_launches, woken = wakes - e->judged_wakes;
    if (launched < JUDGE_MIN_LAUNCHES) return; /* the window grows until there are enough */
    e->judged_launches = launches;
    e->judged_wakes = wakes;
    int pipelined = launched > PIPELINED_LAUNCHES_PER_WAKE * woken;
    if (pipelined == atomic_load(&e->pipelined)) return;
    pthread_mutex_lock(&e->crowd_lock);
    atomic_store(&e->pipelined, pipelined);
    int changed = update_spread(e);
    pthread_mutex_unlock(&e->crowd_lock);
    if (changed) wake_base(e);
}

/* The lanes thread ``k`` serves now, into ``out``; how many. */
static int lanes_of(engine_t *e, int k, int spread, worker_t **out) {
    int n = 0;
    if (k >= e->base) {
        if (spread) out[n++] = &e->workers[k];
        return n;
    }
    out[n++] = &e->workers[k];
    if (!spread)
        for (int j = e->base + k; j < e->nworkers; j += e->base) out[n++] = &e->workers[j];
    return n;
}

/* One round of lane ``w``: Python's commands, then each active ring once. */
static void lane_round(worker_t *w, uint8_t *copy, uint64_t now, int *busy, int *in_flight) {
    engine_t *e = w->engine;
    apply_commands(w);
    atomic_fetch_add_explicit(&w->round, 1, memory_order_seq_cst); /* odd: in a round */
    ring_t **link = &w->active;
    while (*link) {
        ring_t *r = *link;
        if (ring_take(w, r, copy)) *busy = 1;
        if (ring_settle(w, r)) *busy = 1;
        if (r->fcount > 0) *in_flight = 1;
        if (ring_has_work(r) || r->fault_pending || r->held) {
            r->idle_since = 0;
        } else if (r->idle_since == 0) {
            r->idle_since = now;
        } else if (now - r->idle_since > e->spin_ns) {
            /* Off the active list: the client kicks submit_fd once it sees this flag (a
             * device-served ring's client kicks only when the launcher left it a record). */
            if (!r->device) ring_store32(r, DAEMON_WAITS_OFF, 1);
            if (!ring_has_input(r)) {
                r->active = 0;
                w->nactive--;
                *link = r->next_active;
                continue;
            }
            ring_store32(r, DAEMON_WAITS_OFF, 0);
        }
        link = &r->next_active;
    }
    atomic_fetch_add_explicit(&w->round, 1, memory_order_seq_cst); /* even: between */
    atomic_fetch_add_explicit(&w->rounds, 1, memory_order_relaxed);
    /* While busy with some rings, the others' kicks are taken every round and their
     * heads looked at every millisecond: one busy client never starves another. */
    if (w->nactive < w->nrings) {
        take_kicks(w);
        if (now - w->last_scan > 1000000) {
            w->last_scan = now;
            scan_inactive(w);
        }
    }
}

/* ``fn`` on each of ``lanes`` no other thread is serving right now. */
static void try_each(worker_t **lanes, int n, void (*fn)(worker_t *)) {
    for (int i = 0; i < n; i++) {
        if (pthread_mutex_trylock(&lanes[i]->serving) != 0) continue;
        fn(lanes[i]);
        pthread_mutex_unlock(&lanes[i]->serving);
    }
}

/* Sleep on the thread's own lane's epoll set (the lanes it serves too are nested in it)
 * for at most ``ns``; then take the kicks of every lane it serves. */
static void sleep_for(worker_t *own, worker_t **lanes, int n, uint64_t ns) {
    struct pollfd pfd = {.fd = own->epoll_fd, .events = POLLIN};
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    atomic_fetch_add_explicit(&own->sleeps, 1, memory_order_relaxed);
    if (ppoll(&pfd, 1, &ts, NULL) > 0) try_each(lanes, n, take_kicks);
}

/* Nest (or take out) the epoll sets of the lanes thread ``own`` helps, as ``spread`` says. */
static void nest_lanes(engine_t *e, worker_t *own, int spread, int *nested) {
    worker_t *helped[MAX_THREADS];
    int n = lanes_of(e, own->index, 0, helped); /* its own lane first, then those it helps */
    for (int i = 1; i < n; i++) {
        int j = helped[i]->index;
        if (nested[j] == !spread) continue;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = helped[i]};
        epoll_ctl(own->epoll_fd, spread ? EPOLL_CTL_DEL : EPOLL_CTL_ADD, helped[i]->epoll_fd, &ev);
        nested[j] = !spread;
    }
}

/* A thread past ``base`` while no crowd needs it: wait until one does (or the engine stops). */
static void await_crowd(engine_t *e) {
    pthread_mutex_lock(&e->crowd_lock);
    while (!atomic_load(&e->spread) && !atomic_load(&e->stopping)) {
        struct timespec until = realtime_after(20000000);
        pthread_cond_timedwait(&e->crowd_cond, &e->crowd_lock, &until);
    }
    pthread_mutex_unlock(&e->crowd_lock);
}

static void *worker_main(void *arg) {
    worker_t *own = arg;
    engine_t *e = own->engine;
    uint8_t *copy = malloc((size_t)MAX_BATCH * SLOT_SIZE);
    if (copy == NULL) return NULL;
    /* Its short sleeps end when asked: Linux lets a thread's timers run 50 us late by
     * default, which a client waiting on a kernel's end would wait too. */
    prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0);
    prctl(PR_SET_NAME, "accy-engine", 0, 0, 0); /* what top -H and /proc show for it */
    uint64_t last_busy = now_ns();
    uint64_t idle_poll = e->idle_poll_ns;
    unsigned spins = 0;
    int nested[MAX_THREADS] = {0};
    worker_t *lanes[MAX_THREADS];
    while (!atomic_load_explicit(&e->stopping, memory_order_acquire)) {
        uint64_t now = now_ns(); /* this round's clock, for the judgement and the lanes */
        if (own->index == 0) judge_use(e, now);
        int spread = atomic_load(&e->spread);
        if (own->index < e->base) nest_lanes(e, own, spread, nested);
        int n = lanes_of(e, own->index, spread, lanes);
        if (n == 0) {
            await_crowd(e);
            last_busy = now_ns();
            continue;
        }
        int busy = 0, in_flight = 0, active = 0;
        for (int i = 0; i < n; i++) {
            /* Its own lane it waits for (a helper may be ending a round of it); a lane it
             * helps with it skips while that lane's own thread ends one. */
            if (lanes[i] == own) pthread_mutex_lock(&own->serving);
            else if (pthread_mutex_trylock(&lanes[i]->serving) != 0) continue;
            lane_round(lanes[i], copy, now, &busy, &in_flight);
            if (lanes[i]->active) active = 1;
            pthread_mutex_unlock(&lanes[i]->serving);
        }
        if (busy) {
            last_busy = now;
            idle_poll = e->idle_poll_ns;
            if ((++spins & 63) == 0) sched_yield();
            continue;
        }
        uint64_t idle = now - last_busy;
        if (idle < e->spin_ns || (in_flight && idle < e->flight_spin_ns)) {
            if ((++spins & 15) == 0) sched_yield();
            continue;
        }
        if (in_flight) {
            /* A long kernel: look less often, but at least every FLIGHT_POLL_MAX_NS, since
             * its client waits for what we see: 1 ms steps added 0.34 ms to a 2.7 ms one. */
            sleep_for(own, lanes, n, idle_poll);
            if (idle_poll < FLIGHT_POLL_MAX_NS) idle_poll *= 2;
            continue;
        }
        if (active) {
            sleep_for(own, lanes, n, idle_poll); /* quiet rings on the active list: up to 1 ms */
            if (idle_poll < 1000000) idle_poll *= 2;
            continue;
        }
        /* Idle: sleep until a client or Python kicks us; look every 20 ms anyway, for a
         * record published just as its ring went off the active list. */
        sleep_for(own, lanes, n, 20000000);
        try_each(lanes, n, scan_inactive);
        last_busy = now_ns();
    }
    if (own->index < e->base) nest_lanes(e, own, 1, nested);
    pthread_mutex_lock(&own->serving); /* its own lane's last commands: a helper's are done */
    apply_commands(own);
    pthread_mutex_unlock(&own->serving);
    free(copy);
    return NULL;
}

/* ---- Python: the Engine type ----------------------------------------------------------------- */
static PyTypeObject EngineType;

static int post(worker_t *w, command_t *c) {
    pthread_mutex_lock(&w->lock);
    if (w->commands_last) w->commands_last->next = c;
    else w->commands = c;
    w->commands_last = c;
    pthread_mutex_unlock(&w->lock);
    wake_fd(w->wake_fd);
    return 0;
}

/* Wait (GIL released) for a command's ``done`` flag; the worker applies commands between
 * rounds, so this is bounded by one round (or the worker is stopping). */
static void await_done(engine_t *e, atomic_int *done) {
    Py_BEGIN_ALLOW_THREADS
    unsigned spins = 0;
    while (!atomic_load_explicit(done, memory_order_acquire)) {
        if (++spins < 200) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    (void)e;
    Py_END_ALLOW_THREADS
}

static ring_t *ring_lookup(engine_t *e, int64_t id, int *index) {
    for (int k = 0; k < e->nrings_by_id; k++)
        if (e->rings_by_id[k]->id == id) {
            if (index) *index = k;
            return e->rings_by_id[k];
        }
    return NULL;
}

static void engine_dealloc(engine_t *e);

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"threads", "batch", "epochs", "counters", "tokens", "spin_ns",
                         "flight_spin_ns", "idle_poll_ns", "timings", "base", NULL};
    int threads = 1, batch = 64, timings = 0, base = 0;
    unsigned int nepochs = 1 << 18, ncounters = 1 << 16, ntokens = 1 << 16;
    unsigned long long spin = 200000, flight_spin = 2000000, idle_poll = 50000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|iiIIIKKKpi", kw, &threads, &batch, &nepochs,
                                     &ncounters, &ntokens, &spin, &flight_spin, &idle_poll, &timings, &base))
        return NULL;
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d", MAX_THREADS);
        return NULL;
    }
    if (base == 0) base = threads;
    if (base < 1 || base > threads) {
        PyErr_SetString(PyExc_ValueError, "base must be 1..threads (0: threads)");
        return NULL;
    }
    if (batch < 1 || batch > MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "batch must be 1..%d", MAX_BATCH);
        return NULL;
    }
    if (nepochs == 0 || nepochs > (1u << 24) || ncounters == 0 || ncounters > (1u << 20) ||
        ntokens == 0 || ntokens > (1u << 20)) {
        PyErr_SetString(PyExc_ValueError, "epochs, counters and tokens must be 1..2**20 (epochs 2**24)");
        return NULL;
    }
    engine_t *e = (engine_t *)type->tp_alloc(type, 0);
    if (e == NULL) return NULL;
    e->nworkers = threads;
    e->batch = batch;
    e->spin_ns = spin;
    e->flight_spin_ns = flight_spin;
    e->idle_poll_ns = idle_poll ? idle_poll : 1000;
    e->base = base;
    atomic_store(&e->crowded, 0);
    atomic_store(&e->pipelined, 0);
    atomic_store(&e->spread, 0);
    pthread_mutex_init(&e->crowd_lock, NULL);
    pthread_cond_init(&e->crowd_cond, NULL);
    e->timings = timings;
    e->nepochs = nepochs;
    e->ncounters = ncounters;
    e->ntokens = ntokens;
    e->epochs = calloc(nepochs, sizeof(uint64_t));
    e->counts = calloc((size_t)ncounters * 3, sizeof(int64_t));
    e->launched = calloc(ntokens, sizeof(int64_t));
    e->slow_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&e->slow_lock, NULL);
    pthread_cond_init(&e->slow_cond, NULL);
    pthread_mutex_init(&e->rings_lock, NULL);
    atomic_store(&e->serving, 1);
    atomic_store(&e->device_ok, 0);
    for (int k = 0; k < threads; k++) {
        worker_t *w = &e->workers[k];
        w->engine = e;
        w->index = k;
        w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        pthread_mutex_init(&w->lock, NULL);
        pthread_mutex_init(&w->serving, NULL);
        if (w->epoll_fd >= 0 && w->wake_fd >= 0) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
            epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->wake_fd, &ev);
        }
    }
    if (!e->epochs || !e->counts || !e->launched || e->slow_fd < 0) {
        Py_DECREF(e);
        return PyErr_NoMemory();
    }
    for (uint32_t k = 0; k < ncounters; k++) atomic_store(&counter(e, k)[2], -1);
    for (int k = 0; k < threads; k++)
        if (e->workers[k].epoll_fd < 0 || e->workers[k].wake_fd < 0) {
            Py_DECREF(e);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    return (PyObject *)e;
}

static PyObject *engine_set_driver(engine_t *e, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"index", "kind", "context", "launch", "event_create", "event_destroy",
                         "event_record", "event_query", "patch", NULL};
    int index;
    const char *kind;
    unsigned long long context = 0, launch = 0, create = 0, destroy = 0, record = 0, query = 0;
    unsigned long long patch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "is|KKKKKKK", kw, &index, &kind, &context,
                                     &launch, &create, &destroy, &record, &query, &patch))
        return NULL;
    if (index < 0 || index >= MAX_DRIVERS) {
        PyErr_Format(PyExc_ValueError, "a driver index is 0..%d", MAX_DRIVERS - 1);
        return NULL;
    }
    if (e->started) {
        PyErr_SetString(PyExc_RuntimeError, "drivers are set before the engine starts");
        return NULL;
    }
    driver_t *d = &e->drivers[index];
    memset(d, 0, sizeof *d);
    if (strcmp(kind, "cuda") == 0) {
        const char *why = load_cuda();
        if (why) {
            PyErr_SetString(PyExc_OSError, why);
            return NULL;
        }
        d->launch = cuda_launch;
        d->event_create = cuda_event_create;
        d->event_destroy = cuda_event_destroy;
        d->event_record = cuda_event_record;
        d->event_query = cuda_event_query;
        d->set_current = cuda_set_current;
        d->context = context;
    } else if (strcmp(kind, "table") == 0) {
        if (!launch || !create || !destroy || !record || !query) {
            PyErr_SetString(PyExc_ValueError, "a table driver gives all five functions");
            return NULL;
        }
        d->launch = (launch_fn)(uintptr_t)launch;
        d->event_create = (event_create_fn)(uintptr_t)create;
        d->event_destroy = (event_destroy_fn)(uintptr_t)destroy;
        d->event_record = (event_record_fn)(uintptr_t)record;
        d->event_query = (event_query_fn)(uintptr_t)query;
    } else {
        PyErr_Format(PyExc_ValueError, "unknown driver kind %s (cuda or table)", kind);
        return NULL;
    }
    d->patch = (patch_fn)(uintptr_t)patch; /* either kind: a callback of the caller's */
    d->used = 1;
    atomic_fetch_or(&e->device_ok, 1ull << index);
    Py_RETURN_NONE;
}

static PyObject *engine_start(engine_t *e, PyObject *unused) {
    (void)unused;
    if (e->started) Py_RETURN_NONE;
    for (int k = 0; k < e->nworkers; k++) {
        if (pthread_create(&e->workers[k].thread, NULL, worker_main, &e->workers[k]) != 0) {
            atomic_store(&e->stopping, 1);
            for (int j = 0; j < k; j++) {
                wake_fd(e->workers[j].wake_fd);
                pthread_join(e->workers[j].thread, NULL);
                e->workers[j].started = 0;
            }
            PyErr_SetString(PyExc_RuntimeError, "could not start an engine thread");
            return NULL;
        }
        e->workers[k].started = 1;
    }
    e->started = 1;
    Py_RETURN_NONE;
}

static PyObject *engine_add_ring(engine_t *e, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"ring_id", "memory", "slots", "submit_fd", "complete_fd", "counters",
                         "notify_always", "device", NULL};
    long long id;
    PyObject *memory;
    unsigned int slots, c0, c1;
    int submit_fd, complete_fd, notify_always = 0, device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LOIii(II)|pp", kw, &id, &memory, &slots,
                                     &submit_fd, &complete_fd, &c0, &c1, &notify_always, &device))
        return NULL;
    if (slots == 0 || slots > MAX_SLOTS || (slots & (slots - 1))) {
        PyErr_Format(PyExc_ValueError, "slots must be a power of two up to %d", MAX_SLOTS);
        return NULL;
    }
    if (submit_fd < 0 || complete_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a ring needs its submit and complete eventfds");
        return NULL;
    }
    pthread_mutex_lock(&e->rings_lock);
    ring_t *exists = ring_lookup(e, id, NULL);
    pthread_mutex_unlock(&e->rings_lock);
    if (exists) {
        PyErr_Format(PyExc_ValueError, "ring %lld was added already", id);
        return NULL;
    }
    ring_t *r = calloc(1, sizeof *r);
    if (r == NULL) return PyErr_NoMemory();
    if (PyObject_GetBuffer(memory, &r->view, PyBUF_WRITABLE | PyBUF_SIMPLE) != 0) {
        free(r);
        return NULL;
    }
    if (r->view.len < (Py_ssize_t)HEADER_SIZE + (Py_ssize_t)slots * SLOT_SIZE ||
        ((uintptr_t)r->view.buf & 63) != 0) {
        PyBuffer_Release(&r->view);
        free(r);
        PyErr_SetString(PyExc_ValueError, "the ring's memory is smaller than its slots need, or unaligned");
        return NULL;
    }
    r->id = id;
    r->mem = r->view.buf;
    r->size = r->view.len;
    r->slots = slots;
    r->submit_fd = submit_fd;
    r->complete_fd = complete_fd;
    r->notify_always = notify_always;
    r->device = device;
    r->counters[0] = c0;
    r->counters[1] = c1;
    r->tail = ring_load64(r, TAIL_OFF);
    r->done = ring_load64(r, DONE_OFF);
    command_t *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&e->rings_lock);
    if (c != NULL && e->nrings_by_id == e->cap_rings_by_id) {
        int cap = e->cap_rings_by_id ? e->cap_rings_by_id * 2 : 16;
        ring_t **grown = realloc(e->rings_by_id, sizeof(ring_t *) * (size_t)cap);
        if (grown != NULL) {
            e->rings_by_id = grown;
            e->cap_rings_by_id = cap;
        }
    }
    if (c == NULL || e->nrings_by_id == e->cap_rings_by_id) {
        pthread_mutex_unlock(&e->rings_lock);
        free(c);
        PyBuffer_Release(&r->view);
        free(r);
        return PyErr_NoMemory();
    }
    /* A ring goes to the lane holding the fewest (lanes_of says which thread serves it). */
    int best = 0;
    for (int k = 1; k < e->nworkers; k++)
        if (e->workers[k].assigned < e->workers[best].assigned) best = k;
    e->workers[best].assigned++;
    r->owner = &e->workers[best];
    e->rings_by_id[e->nrings_by_id++] = r;
    pthread_mutex_unlock(&e->rings_lock);
    c->kind = CMD_ADD;
    c->ring = r;
    post(&e->workers[best], c);
    Py_RETURN_NONE;
}

static worker_t *owner_of(engine_t *e, ring_t *r) {
    (void)e;
    return r->owner;
}

static PyObject *engine_remove_ring(engine_t *e, PyObject *args) {
    long long id;
    if (!PyArg_ParseTuple(args, "L", &id)) return NULL;
    int index;
    pthread_mutex_lock(&e->rings_lock);
    ring_t *r = ring_lookup(e, id, &index);
    if (r) {
        e->rings_by_id[index] = e->rings_by_id[--e->nrings_by_id];
        r->owner->assigned--;
    }
    pthread_mutex_unlock(&e->rings_lock);
    if (r == NULL) Py_RETURN_NONE;
    atomic_int done = 0;
    command_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PyErr_NoMemory();
    c->kind = CMD_REMOVE;
    c->ring = r;
    c->done = &done;
    worker_t *w = owner_of(e, r);
    if (e->started && !atomic_load(&e->stopping) && w->started) {
        post(w, c);
        await_done(e, &done);
    } else { /* no thread runs: nothing can use the ring */
        pthread_mutex_lock(&w->lock);
        command_t **link = &w->commands;
        w->commands_last = NULL;
        while (*link) {
            if ((*link)->ring == r) {
                command_t *gone = *link;
                *link = gone->next;
                free(gone->streams);
                free(gone->tickets);
                free(gone);
            } else {
                w->commands_last = *link;
                link = &(*link)->next;
            }
        }
        pthread_mutex_unlock(&w->lock);
        drop_ring(w, r);
        free(c);
    }
    PyBuffer_Release(&r->view);
    free(r);
    Py_RETURN_NONE;
}

/* A ticket's free scalars, ``(mask, widths, nonfinite)``: fields ``mask`` (bits 0..7), each
 * field's value width (8 bytes, 1, 2, 4 or 8 for a free one, 0 for another) and exponent bits
 * (8 numbers; 0 for an integer). The ticket's key must hold zeros in the free fields. */
static int parse_free(PyObject *free, const uint8_t *key, free_spec_t *spec) {
    unsigned int mask;
    const char *widths;
    Py_ssize_t nwidths;
    PyObject *nonfinite;
    if (!PyArg_ParseTuple(free, "Iy#O", &mask, &widths, &nwidths, &nonfinite)) return -1;
    PyObject *seq = PySequence_Fast(nonfinite, "a ticket's exponent bits are a sequence");
    if (seq == NULL) return -1;
    int ok = mask != 0 && mask < (1u << MAX_SCALARS) && nwidths == MAX_SCALARS &&
             PySequence_Fast_GET_SIZE(seq) == MAX_SCALARS;
    memset(spec, 0, sizeof *spec);
    spec->mask = (uint8_t)mask;
    memcpy(&spec->handle, key, 4);
    for (int i = 0; ok && i < MAX_SCALARS; i++) {
        unsigned long long bits = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (bits == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        uint8_t width = (uint8_t)widths[i];
        if (!(mask & (1u << i))) {
            ok = width == 0 && bits == 0;
            continue;
        }
        ok = (width == 1 || width == 2 || width == 4 || width == 8) &&
             (width == 8 || bits >> (8 * width) == 0);
        for (int b = 0; ok && b < 8; b++) ok = key[(SCALARS_OFF - KEY_OFF) + 8 * i + b] == 0;
        spec->width[i] = width;
        spec->nonfinite[i] = bits;
    }
    Py_DECREF(seq);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "a ticket's free scalars: a mask of fields 0..7, each free field 1, 2, 4 "
                        "or 8 bytes wide with exponent bits within them and zeros in the key, "
                        "and nothing for the others");
        return -1;
    }
    return 0;
}

/* resume(ring_id, tail, streams, tickets, clear): Python handled the ring's records up to
 * ``tail`` (their work is on ``streams``: (driver, stream, token) each), installs
 * ``tickets`` ((key, driver, exec, stream, token, epoch, epoch_value[, free]) each; ``free``
 * as ``parse_free`` reads it, for a driver that patches) and lets the engine take the ring
 * again. */
static PyObject *engine_resume(engine_t *e, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"ring_id", "tail", "streams", "tickets", "clear", NULL};
    long long id;
    unsigned long long tail;
    PyObject *streams = NULL, *tickets = NULL;
    int clear = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LK|OOp", kw, &id, &tail, &streams, &tickets, &clear))
        return NULL;
    command_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PyErr_NoMemory();
    c->kind = CMD_RESUME;
    c->tail = tail;
    c->clear = clear;
    PyObject *seq = NULL;
    if (streams && streams != Py_None) {
        seq = PySequence_Fast(streams, "streams is a sequence");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > MAX_FLIGHT_EVENTS) {
            PyErr_Format(PyExc_ValueError, "at most %d streams", MAX_FLIGHT_EVENTS);
            goto fail;
        }
        c->streams = calloc((size_t)(n ? n : 1), sizeof(flight_event_t));
        if (!c->streams) goto nomem;
        for (Py_ssize_t k = 0; k < n; k++) {
            unsigned int driver;
            unsigned long long stream;
            int token;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "IKi", &driver, &stream, &token))
                goto fail;
            if (driver >= MAX_DRIVERS || !e->drivers[driver].used) {
                PyErr_Format(PyExc_ValueError, "no driver %u", driver);
                goto fail;
            }
            c->streams[k].driver = (uint8_t)driver;
            c->streams[k].stream = stream;
            c->streams[k].token = token;
        }
        c->nstreams = (int)n;
        Py_CLEAR(seq);
    }
    if (tickets && tickets != Py_None) {
        seq = PySequence_Fast(tickets, "tickets is a sequence");
        if (!seq) goto fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > TICKETS_PER_RING) {
            PyErr_Format(PyExc_ValueError, "at most %d tickets", TICKETS_PER_RING);
            goto fail;
        }
        c->tickets = calloc((size_t)(n ? n : 1), sizeof(ticket_t));
        c->specs = calloc((size_t)(n ? n : 1), sizeof(free_spec_t));
        if (!c->tickets || !c->specs) goto nomem;
        for (Py_ssize_t k = 0; k < n; k++) {
            const char *key;
            Py_ssize_t key_len;
            unsigned int driver, epoch;
            unsigned long long exec, stream, value;
            int token;
            PyObject *free_scalars = Py_None;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "y#IKKiIK|O", &key, &key_len,
                                  &driver, &exec, &stream, &token, &epoch, &value, &free_scalars))
                goto fail;
            if (key_len != KEY_LEN) {
                PyErr_Format(PyExc_ValueError, "a ticket's key is %d bytes", KEY_LEN);
                goto fail;
            }
            if (driver >= MAX_DRIVERS || !e->drivers[driver].used || epoch >= e->nepochs) {
                PyErr_SetString(PyExc_ValueError, "a ticket names an unknown driver or epoch");
                goto fail;
            }
            ticket_t *t = &c->tickets[k];
            if (free_scalars != Py_None) {
                if (e->drivers[driver].patch == NULL) {
                    PyErr_Format(PyExc_ValueError, "driver %u gives no patch: no free scalars",
                                 driver);
                    goto fail;
                }
                if (parse_free(free_scalars, (const uint8_t *)key, &c->specs[k]) != 0) goto fail;
                t->masked = 1;
            }
            memcpy(t->key, key, KEY_LEN);
            t->driver = (uint8_t)driver;
            t->exec = exec;
            t->stream = stream;
            t->token = token;
            t->epoch = epoch;
            t->epoch_value = value;
        }
        c->ntickets = (int)n;
        Py_CLEAR(seq);
    }
    pthread_mutex_lock(&e->rings_lock);
    ring_t *r = ring_lookup(e, id, NULL);
    if (r) {
        c->ring = r;
        post(owner_of(e, r), c);
    }
    pthread_mutex_unlock(&e->rings_lock);
    if (!r) {
        free(c->streams);
        free(c->tickets);
        free(c->specs);
        free(c);
        PyErr_Format(PyExc_KeyError, "no ring %lld", id);
        return NULL;
    }
    Py_RETURN_NONE;
nomem:
    PyErr_NoMemory();
fail:
    Py_XDECREF(seq);
    free(c->streams);
    free(c->tickets);
    free(c->specs);
    free(c);
    return NULL;
}

/* Serve ring ``id`` as the device launcher's (``on``: take only the records it leaves) or as
 * the engine's own again; returns once its thread applied it, with whether it did: ``on``
 * is refused while the ring is busy (records in flight, or with Python). Then every record
 * before the tail is over, and Python lets the launcher watch the ring from there. Before
 * ``off`` Python stops and drains the launcher. */
static PyObject *engine_set_device(engine_t *e, PyObject *args) {
    long long id;
    int on;
    if (!PyArg_ParseTuple(args, "Lp", &id, &on)) return NULL;
    atomic_int done;
    atomic_init(&done, 0);
    command_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PyErr_NoMemory();
    c->kind = CMD_DEVICE;
    c->clear = on;
    int wait = 0;
    pthread_mutex_lock(&e->rings_lock);
    ring_t *r = ring_lookup(e, id, NULL);
    if (r) {
        worker_t *owner = owner_of(e, r);
        /* Waited for only where a thread will apply it (else it is applied at start). */
        wait = e->started && !atomic_load(&e->stopping) && owner->started;
        c->done = wait ? &done : NULL;
        c->ring = r;
        post(owner, c);
    }
    pthread_mutex_unlock(&e->rings_lock);
    if (!r) {
        free(c);
        PyErr_Format(PyExc_KeyError, "no ring %lld", id);
        return NULL;
    }
    if (wait) await_done(e, &done);
    return PyBool_FromLong(!wait || atomic_load(&done) == 1);
}

static PyObject *engine_fault_done(engine_t *e, PyObject *args) {
    long long id;
    if (!PyArg_ParseTuple(args, "L", &id)) return NULL;
    command_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PyErr_NoMemory();
    c->kind = CMD_FAULT_DONE;
    pthread_mutex_lock(&e->rings_lock);
    ring_t *r = ring_lookup(e, id, NULL);
    if (r) {
        c->ring = r;
        post(owner_of(e, r), c);
    }
    pthread_mutex_unlock(&e->rings_lock);
    if (!r) free(c);
    Py_RETURN_NONE;
}

static PyObject *engine_take_slow(engine_t *e, PyObject *args) {
    double timeout = 0.0;
    if (!PyArg_ParseTuple(args, "|d", &timeout)) return NULL;
    slow_item_t *items = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->slow_lock);
    if (e->slow_head == NULL && timeout > 0) {
        struct timespec until = realtime_after((uint64_t)(timeout * 1e9));
        while (e->slow_head == NULL && !atomic_load(&e->stopping))
            if (pthread_cond_timedwait(&e->slow_cond, &e->slow_lock, &until) == ETIMEDOUT) break;
    }
    drain_fd(e->slow_fd);
    items = e->slow_head;
    e->slow_head = e->slow_tail = NULL;
    pthread_mutex_unlock(&e->slow_lock);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(0);
    while (items) {
        slow_item_t *next = items->next;
        if (out) {
            PyObject *item = Py_BuildValue("(iLKii)", items->kind, (long long)items->ring,
                                           (unsigned long long)items->seq, items->code, items->token);
            if (item == NULL || PyList_Append(out, item) != 0) Py_CLEAR(out);
            Py_XDECREF(item);
        }
        free(items);
        items = next;
    }
    return out;
}

static PyObject *engine_bump(engine_t *e, PyObject *args) {
    unsigned int index;
    if (!PyArg_ParseTuple(args, "I", &index)) return NULL;
    if (index >= e->nepochs) {
        PyErr_SetString(PyExc_IndexError, "no such epoch");
        return NULL;
    }
    uint64_t value = atomic_fetch_add_explicit(&e->epochs[index], 1, memory_order_seq_cst) + 1;
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *engine_epoch(engine_t *e, PyObject *args) {
    unsigned int index;
    if (!PyArg_ParseTuple(args, "I", &index)) return NULL;
    if (index >= e->nepochs) {
        PyErr_SetString(PyExc_IndexError, "no such epoch");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(atomic_load(&e->epochs[index]));
}

/* Return once no launch checked against an epoch before this call can still be made, and
 * every command posted before it (a resume naming a stream, say) was applied: each worker
 * applies a barrier between rounds, after the commands before it. */
static PyObject *engine_quiesce(engine_t *e, PyObject *unused) {
    (void)unused;
    if (!e->started || atomic_load(&e->stopping)) Py_RETURN_NONE;
    atomic_int done[MAX_THREADS];
    int posted[MAX_THREADS];
    for (int k = 0; k < e->nworkers; k++) {
        atomic_init(&done[k], 0);
        posted[k] = 0;
        if (!e->workers[k].started) continue;
        command_t *c = calloc(1, sizeof *c);
        if (c == NULL) return PyErr_NoMemory();
        c->kind = CMD_BARRIER;
        c->done = &done[k];
        post(&e->workers[k], c);
        posted[k] = 1;
    }
    for (int k = 0; k < e->nworkers; k++)
        if (posted[k]) await_done(e, &done[k]);
    Py_RETURN_NONE;
}

static int counter_index(engine_t *e, PyObject *args, unsigned int *index, long long *value) {
    if (!PyArg_ParseTuple(args, "IL", index, value)) return -1;
    if (*index >= e->ncounters) {
        PyErr_SetString(PyExc_IndexError, "no such counter");
        return -1;
    }
    return 0;
}

static PyObject *engine_set_limit(engine_t *e, PyObject *args) {
    unsigned int index;
    long long value;
    if (counter_index(e, args, &index, &value)) return NULL;
    atomic_store(&counter(e, index)[2], value);
    Py_RETURN_NONE;
}

static PyObject *engine_set_external(engine_t *e, PyObject *args) {
    unsigned int index;
    long long value;
    if (counter_index(e, args, &index, &value)) return NULL;
    atomic_store(&counter(e, index)[1], value);
    Py_RETURN_NONE;
}

static PyObject *engine_reset_counter(engine_t *e, PyObject *args) {
    unsigned int index;
    if (!PyArg_ParseTuple(args, "I", &index)) return NULL;
    if (index >= e->ncounters) {
        PyErr_SetString(PyExc_IndexError, "no such counter");
        return NULL;
    }
    atomic_store(&counter(e, index)[0], 0);
    atomic_store(&counter(e, index)[1], 0);
    atomic_store(&counter(e, index)[2], -1);
    Py_RETURN_NONE;
}

static PyObject *engine_in_flight(engine_t *e, PyObject *args) {
    unsigned int index;
    if (!PyArg_ParseTuple(args, "I", &index)) return NULL;
    if (index >= e->ncounters) {
        PyErr_SetString(PyExc_IndexError, "no such counter");
        return NULL;
    }
    return PyLong_FromLongLong(atomic_load(&counter(e, index)[0]));
}

static PyObject *engine_set_serving(engine_t *e, PyObject *args) {
    int serving;
    if (!PyArg_ParseTuple(args, "p", &serving)) return NULL;
    atomic_store(&e->serving, serving);
    Py_RETURN_NONE;
}

static PyObject *engine_set_device_ok(engine_t *e, PyObject *args) {
    int index, ok;
    if (!PyArg_ParseTuple(args, "ip", &index, &ok)) return NULL;
    if (index < 0 || index >= MAX_DRIVERS) {
        PyErr_SetString(PyExc_IndexError, "no such driver");
        return NULL;
    }
    if (ok) atomic_fetch_or(&e->device_ok, 1ull << index);
    else atomic_fetch_and(&e->device_ok, ~(1ull << index));
    Py_RETURN_NONE;
}

static PyObject *engine_launched(engine_t *e, PyObject *unused) {
    (void)unused;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (uint32_t k = 0; k < e->ntokens; k++) {
        if (atomic_load_explicit(&e->launched[k], memory_order_relaxed) == 0) continue;
        int64_t n = atomic_exchange(&e->launched[k], 0);
        if (n == 0) continue;
        PyObject *item = Py_BuildValue("(IL)", k, (long long)n);
        if (item == NULL || PyList_Append(out, item) != 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    return out;
}

static PyObject *engine_touched(engine_t *e, PyObject *unused) {
    (void)unused;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    pthread_mutex_lock(&e->rings_lock);
    for (int k = 0; k < e->nrings_by_id; k++) {
        ring_t *r = e->rings_by_id[k];
        if (atomic_exchange(&r->touched, 0)) {
            PyObject *id = PyLong_FromLongLong(r->id);
            if (id == NULL || PyList_Append(out, id) != 0) {
                Py_XDECREF(id);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(id);
        }
    }
    pthread_mutex_unlock(&e->rings_lock);
    return out;
}

static PyObject *engine_stats(engine_t *e, PyObject *unused) {
    (void)unused;
    unsigned long long fast = 0, slow = 0, launches = 0, rounds = 0, sleeps = 0;
    for (int k = 0; k < e->nworkers; k++) {
        fast += atomic_load(&e->workers[k].fast);
        slow += atomic_load(&e->workers[k].slow);
        launches += atomic_load(&e->workers[k].launches);
        rounds += atomic_load(&e->workers[k].rounds);
        sleeps += atomic_load(&e->workers[k].sleeps);
    }
    PyObject *per_lane = PyList_New(e->nworkers);
    if (per_lane == NULL) return NULL;
    pthread_mutex_lock(&e->rings_lock);
    int rings = e->nrings_by_id;
    for (int k = 0; k < e->nworkers; k++)
        PyList_SET_ITEM(per_lane, k, PyLong_FromLong(e->workers[k].assigned));
    pthread_mutex_unlock(&e->rings_lock);
    for (int k = 0; k < e->nworkers; k++)
        if (PyList_GET_ITEM(per_lane, k) == NULL) {
            Py_DECREF(per_lane);
            return NULL;
        }
    PyObject *calls = PyDict_New(), *call_ns = PyDict_New();
    for (int kind = 0; calls && call_ns && kind < CALL_KINDS; kind++) {
        unsigned long long n = 0, ns = 0;
        for (int k = 0; k < e->nworkers; k++) {
            n += atomic_load(&e->workers[k].calls[kind]);
            ns += atomic_load(&e->workers[k].call_ns[kind]);
        }
        PyObject *a = PyLong_FromUnsignedLongLong(n), *b = PyLong_FromUnsignedLongLong(ns);
        int bad = !a || !b || PyDict_SetItemString(calls, CALL_NAMES[kind], a) < 0 ||
                  PyDict_SetItemString(call_ns, CALL_NAMES[kind], b) < 0;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (bad) Py_CLEAR(calls);
    }
    if (!calls || !call_ns) {
        Py_XDECREF(calls);
        Py_XDECREF(call_ns);
        Py_DECREF(per_lane);
        return NULL;
    }
    return Py_BuildValue("{sKsKsKsKsKsisisNsNsNsOsO}", "fast_records", fast, "slow_records",
                         slow, "launches", launches, "rounds", rounds, "sleeps", sleeps, "rings",
                         rings, "threads", e->nworkers, "calls", calls, "call_ns", call_ns,
                         "rings_per_lane", per_lane, "pipelined",
                         atomic_load(&e->pipelined) ? Py_True : Py_False, "spread",
                         atomic_load(&e->spread) ? Py_True : Py_False);
}

static void engine_stop_threads(engine_t *e) {
    if (!e->started) return;
    atomic_store(&e->stopping, 1);
    for (int k = 0; k < e->nworkers; k++) wake_fd(e->workers[k].wake_fd);
    pthread_mutex_lock(&e->crowd_lock);
    pthread_cond_broadcast(&e->crowd_cond);
    pthread_mutex_unlock(&e->crowd_lock);
    pthread_mutex_lock(&e->slow_lock);
    pthread_cond_broadcast(&e->slow_cond);
    pthread_mutex_unlock(&e->slow_lock);
    for (int k = 0; k < e->nworkers; k++) {
        if (e->workers[k].started) {
            pthread_join(e->workers[k].thread, NULL);
            e->workers[k].started = 0;
        }
    }
}

static PyObject *engine_stop(engine_t *e, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    engine_stop_threads(e);
    Py_END_ALLOW_THREADS
    /* Every ring left is dropped here (their exports released). */
    for (;;) {
        pthread_mutex_lock(&e->rings_lock);
        ring_t *r = e->nrings_by_id ? e->rings_by_id[--e->nrings_by_id] : NULL;
        pthread_mutex_unlock(&e->rings_lock);
        if (r == NULL) break;
        drop_ring(owner_of(e, r), r);
        PyBuffer_Release(&r->view);
        free(r);
    }
    for (int k = 0; k < e->nworkers; k++) {
        worker_t *w = &e->workers[k];
        for (int d = 0; d < MAX_DRIVERS; d++) {
            for (int j = 0; j < w->pooled[d]; j++) e->drivers[d].event_destroy(w->pool[d][j]);
            w->pooled[d] = 0;
        }
    }
    Py_RETURN_NONE;
}

static void engine_dealloc(engine_t *e) {
    engine_stop_threads(e);
    for (int k = 0; k < e->nrings_by_id; k++) {
        ring_t *r = e->rings_by_id[k];
        free(r->tickets);
        free(r->specs);
        PyBuffer_Release(&r->view);
        free(r);
    }
    free(e->rings_by_id);
    for (int k = 0; k < e->nworkers; k++) {
        worker_t *w = &e->workers[k];
        command_t *c = w->commands;
        while (c) {
            command_t *next = c->next;
            free(c->streams);
            free(c->tickets);
            free(c->specs);
            free(c);
            c = next;
        }
        for (int d = 0; d < MAX_DRIVERS; d++) free(w->pool[d]);
        free(w->rings);
        if (w->epoll_fd >= 0) close(w->epoll_fd);
        if (w->wake_fd >= 0) close(w->wake_fd);
        pthread_mutex_destroy(&w->lock);
        pthread_mutex_destroy(&w->serving);
    }
    pthread_mutex_destroy(&e->crowd_lock);
    pthread_cond_destroy(&e->crowd_cond);
    slow_item_t *item = e->slow_head;
    while (item) {
        slow_item_t *next = item->next;
        free(item);
        item = next;
    }
    if (e->slow_fd >= 0) close(e->slow_fd);
    free((void *)e->epochs);
    free((void *)e->counts);
    free((void *)e->launched);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *engine_slow_fd(engine_t *e, void *closure) {
    (void)closure;
    return PyLong_FromLong(e->slow_fd);
}

static PyObject *engine_get_crowded(engine_t *e, void *closure) {
    (void)closure;
    return PyBool_FromLong(atomic_load(&e->crowded));
}

static int engine_set_crowded(engine_t *e, PyObject *value, void *closure) {
    (void)closure;
    int crowded = value ? PyObject_IsTrue(value) : -1;
    if (crowded < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "crowded cannot be deleted");
        return -1;
    }
    pthread_mutex_lock(&e->crowd_lock);
    atomic_store(&e->crowded, crowded);
    int changed = update_spread(e);
    pthread_mutex_unlock(&e->crowd_lock);
    if (changed) wake_base(e);
    return 0;
}

static PyGetSetDef engine_getset[] = {
    {"slow_fd", (getter)engine_slow_fd, NULL, "An eventfd readable while slow items wait.", NULL},
    {"crowded", (getter)engine_get_crowded, (setter)engine_set_crowded,
     "Whether the clients are a crowd: every thread then serves its own lane, unless they "
     "pipeline (stats: pipelined, spread); else the first BASE serve them all.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef engine_methods[] = {
    {"set_driver", (PyCFunction)(void (*)(void))engine_set_driver, METH_VARARGS | METH_KEYWORDS,
     "Set driver slot INDEX: kind 'cuda' (a context) or 'table' (five function addresses)."},
    {"start", (PyCFunction)engine_start, METH_NOARGS, "Start the engine threads."},
    {"stop", (PyCFunction)engine_stop, METH_NOARGS, "Stop the threads and drop every ring."},
    {"add_ring", (PyCFunction)(void (*)(void))engine_add_ring, METH_VARARGS | METH_KEYWORDS,
     "Take a ring's records from now on."},
    {"remove_ring", (PyCFunction)engine_remove_ring, METH_VARARGS,
     "Stop taking a ring; returns once no engine thread holds it."},
    {"resume", (PyCFunction)(void (*)(void))engine_resume, METH_VARARGS | METH_KEYWORDS,
     "Python handled a parked ring's records up to tail: take it again."},
    {"set_device", (PyCFunction)engine_set_device, METH_VARARGS,
     "set_device(ring_id, on): the device launcher serves the ring (on) or the engine again"},
    {"fault_done", (PyCFunction)engine_fault_done, METH_VARARGS,
     "Python wrote a ring's fault entry: its done may advance."},
    {"take_slow", (PyCFunction)engine_take_slow, METH_VARARGS,
     "The slow items waiting, after waiting up to timeout seconds for one."},
    {"bump", (PyCFunction)engine_bump, METH_VARARGS, "Make tickets of an epoch stale."},
    {"epoch", (PyCFunction)engine_epoch, METH_VARARGS, "An epoch's value."},
    {"quiesce", (PyCFunction)engine_quiesce, METH_NOARGS,
     "Return once no launch checked before the call can still be made."},
    {"set_limit", (PyCFunction)engine_set_limit, METH_VARARGS, "A counter's limit (-1: none)."},
    {"set_external", (PyCFunction)engine_set_external, METH_VARARGS,
     "Python's own launches in flight under a counter."},
    {"reset_counter", (PyCFunction)engine_reset_counter, METH_VARARGS, "A counter, as new."},
    {"in_flight", (PyCFunction)engine_in_flight, METH_VARARGS,
     "The engine's own launches in flight under a counter."},
    {"set_serving", (PyCFunction)engine_set_serving, METH_VARARGS, "Launch tickets or not."},
    {"set_device_ok", (PyCFunction)engine_set_device_ok, METH_VARARGS,
     "Whether a driver's device may still be launched on."},
    {"launched", (PyCFunction)engine_launched, METH_NOARGS,
     "(token, launches) since the last call, for each session token that launched."},
    {"touched", (PyCFunction)engine_touched, METH_NOARGS,
     "The rings that published records since the last call."},
    {"stats", (PyCFunction)engine_stats, METH_NOARGS, "The engine's counters."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "accyd.engine._native.Engine",
    .tp_basicsize = sizeof(engine_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native launch engine: threads that take ring records and launch tickets.",
    .tp_new = engine_new,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "accyd.engine._native",
    "The native launch engine of accyd's ring doors (C, loading libcuda.so.1 at run time).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *layout = Py_BuildValue(
        "{sisisisisisisisisisisisisisisisisisisi}", "HEAD", HEAD_OFF, "TAIL", TAIL_OFF, "DONE", DONE_OFF,
        "CLIENT_WAITS", CLIENT_WAITS_OFF, "DAEMON_WAITS", DAEMON_WAITS_OFF, "CLOSED", CLOSED_OFF,
        "LEFT", LEFT_OFF,
        "HEADER_SIZE", HEADER_SIZE, "SLOT_SIZE", SLOT_SIZE, "KIND", KIND_OFF, "FLAGS", FLAGS_OFF,
        "KEY", KEY_OFF, "KEY_END", KEY_END, "LAUNCH", KIND_LAUNCH, "NOTIFY", FLAG_NOTIFY,
        "MAX_SLOTS", MAX_SLOTS, "NOT_READY", ERR_NOT_READY, "SCALARS", SCALARS_OFF,
        "MAX_SCALARS", MAX_SCALARS);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "SLOW_RECORD", SLOW_RECORD);
    PyModule_AddIntConstant(m, "SLOW_BROKEN", SLOW_BROKEN);
    PyModule_AddIntConstant(m, "SLOW_LAUNCH_FAILED", SLOW_LAUNCH_FAILED);
    PyModule_AddIntConstant(m, "SLOW_FAULT", SLOW_FAULT);
    PyModule_AddIntConstant(m, "MAX_DRIVERS", MAX_DRIVERS);
    PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS);
    PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH);
    PyModule_AddIntConstant(m, "TICKETS_PER_RING", TICKETS_PER_RING);
    PyModule_AddIntConstant(m, "ERR_CALLBACK", ERR_CALLBACK);
    return m;
}
