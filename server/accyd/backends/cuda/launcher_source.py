"""The device launcher's CUDA source and the layout of the tables it shares with the host.

The launcher (``device_launcher.py``) is a kernel that stays resident: each of its threads
watches one ring's ``head`` in the ring's own memory, mapped into the GPU, and launches the
record's checked graph from the device (device graph launch), so no CPU of the daemon is
on a waited launch's path. The source is formatted with the ring's offsets from
``accy.protocol.ring`` and the table sizes below, and asserts the sizes the host packs
(``static_assert``), so the two sides cannot drift apart.

What the GPU reads and writes:

- ``Ring`` (device memory, one per attached ring): the ring's mapped address and slot count,
  ``live``, and the counters only the GPU changes: ``claimed`` (the records before it were
  taken, by the launcher or left to the CPU path) and ``left`` (``seq + 1`` of the last
  record left to the CPU path, also written to the ring's own ``left`` word for its client
  and the ring engine), and its tickets.
- ``Ticket``: a record's launch bytes (``KEY`` .. ``KEY_END``: session handle, counts,
  buffer handles, scalar bytes), the epoch word it was checked against and that word's
  value then, and ``INSTANCES`` instances of its graph (the device refuses to launch a graph
  while an earlier launch of it still runs).
- ``Control`` (pinned host memory the GPU maps): ``stop`` and the host's ``generation`` (one
  8-byte word every instance reads each round), and each instance's acknowledgement of the
  generation it read; then, for the host only, the pinned staging its writes to the tables
  go through, and its copy of the epoch words. The word is read over PCIe on purpose: with
  it in device memory a round took 2.6-3.2 µs instead of 6-10, yet a launch's latency grew
  (p50 30.5-34.5 against 26.5-27.5 µs for one client, 0.86-0.91x the rate at 32; H100, both in
  the same runs): a faster poll slowed the device's own graph launches.
- The epoch words (device memory): a ticket holds while its word reads the ticket's value.
- ``Stats`` (device memory): launches made, launch errors, runs, records left, rounds, and the
  time of each step of the launches made.

A record is served when everything before it is over (``done == seq``: one in flight per
ring), nobody took it (``claimed <= seq``), it is a launch, and its bytes equal a live
ticket's whose epoch still holds. Anything else is left to the CPU path (``left``), which
checks it in full as it does today. The last node of every device graph (``accy_done``)
publishes the ring's ``done``.
"""

from __future__ import annotations

from accy.protocol import ring as layout

__all__ = [
    "ACK_OFFSET",
    "CONTROL_BYTES",
    "EPOCHS",
    "EPOCH_OFFSET",
    "GENERATION_OFFSET",
    "INSTANCES",
    "KEY_BYTES",
    "LAUNCHERS",
    "MAX_RINGS",
    "RING_BYTES",
    "RING_FIELDS",
    "RING_LIVE_OFFSET",
    "SOURCE",
    "STAGING_OFFSET",
    "STATS_BYTES",
    "STATS_FIELDS",
    "STOP_OFFSET",
    "TICKETS",
    "TICKET_BYTES",
    "TICKET_OFFSET",
    "source",
]

KEY, KEY_END = layout.LAUNCH_KEY, layout.RECORD.size
KEY_BYTES = KEY_END - KEY
"""A record's launch bytes, compared whole (136)."""
INSTANCES = 4
"""Graph instances per ticket."""
TICKETS = 8
"""Tickets per ring."""
MAX_RINGS = 128
"""Rings one launcher serves: one thread of each instance's block per ring."""
LAUNCHERS = 4
"""Launcher instances polling at once, each on its own stream (``Control``'s acks)."""
TICKET_BYTES = 192
TICKET_OFFSET = 64
"""Where a ring's tickets start in its ``Ring``."""
RING_BYTES = TICKET_OFFSET + TICKETS * TICKET_BYTES
RING_FIELDS = "<QIIQQQ"
"""``Ring``'s head: base, slot_count, live, claimed, left, launched."""
RING_LIVE_OFFSET = 12
"""Where ``Ring.live`` is: the host sets it last when a ring comes and first when it goes."""
STATS_FIELDS = "<QQQQQQQQQI"
"""``Stats``: launched, errors, runs, left, rounds, their nanoseconds; for the launches made,
the nanoseconds from the look's start to the launch call, in the launch call, and from its
return to the graph's ``accy_done``; the last launch error's code."""
STATS_BYTES = 128
STOP_OFFSET, GENERATION_OFFSET, ACK_OFFSET, STAGING_OFFSET, EPOCH_OFFSET = 0, 4, 64, 1024, 4096
"""Where ``Control``'s words are; staging and the epochs' copy are the host's alone."""
EPOCHS = 512
CONTROL_BYTES = EPOCH_OFFSET + 8 * EPOCHS

SOURCE = r"""
#include <cuda_runtime.h>

#define HEAD_OFF {head}
#define DONE_OFF {done}
#define LEFT_OFF {left}
#define HEADER_SIZE {header}
#define SLOT_SIZE {slot}
#define KEY {key}
#define KEY_WORDS {key_words}
#define LAUNCH_KIND {launch}
#define INSTANCES {instances}
#define TICKETS {tickets}
#define MAX_RINGS {max_rings}
#define LAUNCHERS {launchers}

struct Ticket {{
    unsigned key[KEY_WORDS];
    unsigned live;
    unsigned next;                      /* launches tried (the host counts them) */
    unsigned long long epoch;           /* device address of the epoch word */
    unsigned long long value;           /* the ticket holds while the word reads this */
    unsigned long long exec[INSTANCES]; /* cudaGraphExec_t, instantiated for device launch */
}};
struct Ring {{
    unsigned long long base;            /* the ring's memory, mapped (device address) */
    unsigned slot_count;
    unsigned live;
    unsigned long long claimed;         /* records before it are taken */
    unsigned long long left;            /* seq + 1 of the last record left to the CPU path */
    unsigned long long launched;
    unsigned long long launched_at;     /* when its last graph was launched (globaltimer) */
    unsigned long long pad[2];
    Ticket tickets[TICKETS];
}};
struct Stats {{
    unsigned long long launched, errors, runs, left, rounds, round_ns;
    unsigned long long look_ns, launch_ns, graph_ns;
    unsigned last_error;
}};
struct Control {{
    unsigned stop;
    unsigned generation;
    unsigned pad[14];
    unsigned ack[LAUNCHERS];
}};
static_assert(sizeof(Ticket) == {ticket_bytes}, "Ticket's size is the host's");
static_assert(sizeof(Ring) - sizeof(Ticket) * TICKETS == {ticket_offset}, "Ring's head: host's");
static_assert(sizeof(Ring) == {ring_bytes}, "Ring's size is the host's");
static_assert(sizeof(Control) == {ack_offset} + 4 * LAUNCHERS, "Control's acks are the host's");
static_assert(sizeof(Stats) <= {stats_bytes}, "Stats fit the host's");

/* Loads of the ring's words (mapped host memory, over PCIe) and of the tables. Only a ring's
 * ``head`` is read with acquire: the record's slot is read after it, so a record is never
 * seen older than its ``head`` says. Everything else is a plain volatile load: a stale
 * ``done`` only skips a round, and the tables and epochs are ordered by the round's
 * generation read (the host's copy into device memory is over before it writes the
 * generation; a round reads the generation first). A round makes one round trip over PCIe
 * for the generation, and a look that serves a record two more: ``done`` with ``head``,
 * then the record (with its claim). */
__device__ __forceinline__ unsigned long long load_acquire(unsigned long long address) {{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(address) : "memory");
    return v;
}}
__device__ __forceinline__ uint4 load16(unsigned long long address) {{
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {{%0, %1, %2, %3}}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(address) : "memory");
    return v;
}}
__device__ __forceinline__ unsigned long long now_ns(void) {{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}}
#define VOLATILE64(x) (*(volatile unsigned long long *)&(x))
#define VOLATILE32(x) (*(volatile unsigned *)&(x))
#define RECORD_WORDS ((KEY / 4 + KEY_WORDS + 3) / 4 * 4)

/* Leave record ``seq`` to the CPU path (no ticket, a stale one, or a failed launch): said in
 * the table and in the ring's ``left`` word, which the ring's client and engine read. */
__device__ void leave(Ring *r, Stats *stats, unsigned long long seq) {{
    VOLATILE64(r->left) = seq + 1;
    __threadfence_system();
    *(volatile unsigned long long *)(VOLATILE64(r->base) + LEFT_OFF) = seq + 1;
    atomicAdd(&stats->left, 1ull);
}}

/* The live ticket whose key is the record's launch bytes (``words`` from the slot's start). */
__device__ Ticket *find(Ring *r, const unsigned *words) {{
    for (int t = 0; t < TICKETS; t++) {{
        Ticket *ticket = &r->tickets[t];
        if (!VOLATILE32(ticket->live)) continue;
        unsigned differ = 0; /* every word compared: the loads go out together */
        for (int w = 0; w < KEY_WORDS; w++) differ |= __ldcg(&ticket->key[w]) ^ words[KEY / 4 + w];
        if (!differ) return ticket;
    }}
    return 0;
}}

/* One look at ring ``r``: serve its next record if it may be served now. */
__device__ void serve(Ring *r, Stats *stats, int *used, int per_run) {{
    if (!VOLATILE32(r->live)) return;
    unsigned long long look = now_ns();
    unsigned long long base = VOLATILE64(r->base);
    unsigned long long claimed = VOLATILE64(r->claimed);
    unsigned slots = VOLATILE32(r->slot_count);
    /* ``done`` and ``head`` are read together: one round trip over PCIe, not two. */
    unsigned long long done = *(volatile unsigned long long *)(base + DONE_OFF);
    unsigned long long head = load_acquire(base + HEAD_OFF);
    if (claimed > done) return; /* a record is in flight */
    if (head <= done) return; /* nothing new */
    if (atomicAdd(used, 1) >= per_run) return; /* this run's launches are spent: the next's */
    /* Claim it, and read its slot while the claim is answered (neither waits for the other). */
    unsigned long long got = atomicCAS(&r->claimed, claimed, done + 1);
    unsigned long long slot = base + HEADER_SIZE + (done % slots) * SLOT_SIZE;
    unsigned words[RECORD_WORDS];
    for (int q = 0; q < RECORD_WORDS / 4; q++) {{ /* 16 bytes a read, all sent at once */
        uint4 v = load16(slot + 16 * q);
        words[4 * q] = v.x;
        words[4 * q + 1] = v.y;
        words[4 * q + 2] = v.z;
        words[4 * q + 3] = v.w;
    }}
    if (got != claimed) {{
        atomicSub(used, 1); /* another instance took it */
        return;
    }}
    unsigned long long seq = words[0] | ((unsigned long long)words[1] << 32);
    Ticket *ticket = seq == done && (words[2] & 0xffffu) == LAUNCH_KIND ? find(r, words) : 0;
    unsigned k = (unsigned)(done % INSTANCES); /* one record in flight: never a running one */
    cudaGraphExec_t exec = 0;
    if (ticket) {{ /* the epochs are in device memory: no round trip */
        unsigned long long address = VOLATILE64(ticket->epoch), value = VOLATILE64(ticket->value);
        /* Not through L1: a ticket's place may have held another ticket earlier in this run. */
        exec = (cudaGraphExec_t)VOLATILE64(ticket->exec[k]);
        if (*(volatile unsigned long long *)address != value) ticket = 0; /* revoked since */
    }}
    if (!ticket) {{
        atomicSub(used, 1);
        leave(r, stats, done);
        return;
    }}
    unsigned long long call = now_ns();
    VOLATILE64(r->launched_at) = call; /* before the launch: its accy_done reads it */
    cudaError_t error = cudaGraphLaunch(exec, cudaStreamGraphFireAndForget);
    unsigned long long back = now_ns();
    atomicAdd(&ticket->next, 1u);
    if (error == cudaSuccess) {{
        VOLATILE64(r->launched_at) = back;
        atomicAdd(&stats->launched, 1ull);
        atomicAdd(&r->launched, 1ull);
        atomicAdd(&stats->look_ns, call - look);
        atomicAdd(&stats->launch_ns, back - call);
    }} else {{
        atomicAdd(&stats->errors, 1ull);
        stats->last_error = (unsigned)error;
        leave(r, stats, done);
    }}
}}

/* One launcher instance: thread i watches ring i, round after round, until this run has
 * made ``per_run`` launches (a graph may make 120 fire-and-forget launches), ``rounds``
 * rounds passed (so an idle launcher ends and a device-wide wait is never held up for
 * long), or the host asks it to stop (``stop`` is read with the generation, in one load).
 * A run is over only once every graph it launched is (fire-and-forget children belong to
 * it): a host that stops the runs and sees their streams idle knows none still runs. Each
 * round acknowledges
 * the generation it began at: a host that revoked or detached something and saw every
 * instance acknowledge its new generation knows no launch checked against the old tables
 * can still be made. */
extern "C" __global__ void accy_launcher(Ring *rings, Stats *stats, Control *control,
                                         int instance, int per_run, int rounds) {{
    __shared__ int used, quit;
    __shared__ unsigned generation;
    int i = threadIdx.x;
    unsigned long long began = now_ns();
    if (i == 0) {{
        used = 0;
        quit = 0;
        atomicAdd(&stats->runs, 1ull);
    }}
    int round = 0;
    unsigned stop = 0;
    for (;; round++) {{
        /* Stop and generation: one 8-byte word, read every round. A round acknowledges the
         * generation read before it began. */
        if (i == 0) {{
            unsigned long long word = VOLATILE64(*(unsigned long long *)control);
            stop = (unsigned)word;
            generation = (unsigned)(word >> 32);
        }}
        __syncthreads();
        if (i < MAX_RINGS) serve(&rings[i], stats, &used, per_run);
        __syncthreads(); /* every look of this round is over */
        if (i == 0) {{
            VOLATILE32(control->ack[instance]) = generation;
            if (used >= per_run || round + 1 >= rounds || stop) quit = 1;
        }}
        __syncthreads();
        if (quit) break;
    }}
    if (i == 0) {{
        atomicAdd(&stats->rounds, (unsigned long long)round + 1);
        atomicAdd(&stats->round_ns, now_ns() - began);
    }}
}}

/* The last node of every device graph: the record's work is over, so publish ``done``, and
 * count the time since its launch returned (never less than 0: the launcher stamps
 * ``launched_at`` once its launch call returns, which may be after this ran). */
extern "C" __global__ void accy_done(Ring *r, Stats *stats) {{
    unsigned long long at = VOLATILE64(r->launched_at), now = now_ns();
    atomicAdd(&stats->graph_ns, now > at ? now - at : 0ull);
    __threadfence_system();
    *(volatile unsigned long long *)(VOLATILE64(r->base) + DONE_OFF) = VOLATILE64(r->claimed);
}}
"""


def source() -> str:
    """``SOURCE`` with the ring's layout and the tables' sizes written in."""
    return SOURCE.format(
        head=layout.HEAD,
        done=layout.DONE,
        left=layout.LEFT,
        header=layout.HEADER_SIZE,
        slot=layout.SLOT_SIZE,
        key=KEY,
        key_words=KEY_BYTES // 4,
        launch=int(layout.Kind.LAUNCH),
        instances=INSTANCES,
        tickets=TICKETS,
        max_rings=MAX_RINGS,
        launchers=LAUNCHERS,
        ticket_bytes=TICKET_BYTES,
        ticket_offset=TICKET_OFFSET,
        ring_bytes=RING_BYTES,
        ack_offset=ACK_OFFSET,
        stats_bytes=STATS_BYTES,
    )
