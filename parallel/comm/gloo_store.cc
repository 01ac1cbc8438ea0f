// gloo_store: see gloo_store.h. The only C++ in parallel/: gloo's API is C++ (shared pointers,
// option objects, exceptions), so this file holds every gloo call and hands comm_gloo.c plain C
// functions that return -1 with gloo's message instead of throwing.
// ustrain's C headers, with C linkage; C11's _Noreturn is spelled [[noreturn]] in C++.
#define _Noreturn [[noreturn]]
extern "C" {
#include "bootstrap.h"
#include "error.h"
}
#undef _Noreturn
#include "gloo_store.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// gloo's Store over the bootstrap: set() publishes "<prefix>.<key>" under this rank, get() and
// wait() read it from the rank that owns the key. gloo's full-mesh rendezvous names each
// member's addresses "<i>" (newer gloo: "rank_<i>"), so member i's global rank owns them; the
// bootstrap's own authentication (the job secret) covers every exchange.
class BootStore : public gloo::rendezvous::Store {
  public:
    BootStore(ust_boot *b, std::string prefix, std::vector<int> granks)
        : b_(b), prefix_(std::move(prefix)), granks_(std::move(granks)) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        ust_err e;
        std::string k = prefix_ + "." + key;
        if (boot_put(b_, k.c_str(), data.data(), data.size(), &e) < 0)
            throw std::runtime_error(std::string("gloo store: ") + e.msg);
    }

    std::vector<char> get(const std::string &key) override {
        wait({key});
        return cache_[key];
    }

    void wait(const std::vector<std::string> &keys) override {
        for (const std::string &key : keys) {
            if (cache_.count(key)) continue;
            int owner = owner_of(key);
            std::vector<char> buf(65536);
            ust_err e;
            std::string k = prefix_ + "." + key;
            int n = boot_get(b_, owner, k.c_str(), buf.data(), buf.size(), &e);
            if (n < 0) throw std::runtime_error(std::string("gloo store: ") + e.msg);
            buf.resize((size_t)n);
            cache_[key] = std::move(buf);
        }
    }

    // The bootstrap bounds every wait by its own timeout (dist.timeout_s).
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
        wait(keys);
    }

  private:
    int owner_of(const std::string &key) const {
        const char *num = key.c_str() + (key.rfind("rank_", 0) == 0 ? 5 : 0);
        char *end = nullptr;
        long i = std::strtol(num, &end, 10);
        if (*num && end && !*end && i >= 0 && i < (long)granks_.size()) return granks_[(size_t)i];
        throw std::runtime_error("gloo store: key '" + key +
                                 "' names no member (expected <member> or rank_<member>)");
    }

    ust_boot *b_;
    std::string prefix_;
    std::vector<int> granks_;
    std::map<std::string, std::vector<char>> cache_;
};

void put_err(char *err, size_t cap, const char *what, const std::exception &x) {
    if (err && cap) std::snprintf(err, cap, "%s: %s", what, x.what());
}

// Slots of the transfers this file drives itself (above gloo's own prefixes 0x01..0x08).
constexpr uint8_t kBatchSlotPrefix = 0x20;
constexpr uint8_t kRingSlotPrefix = 0x21;

} // namespace

struct ugloo_dev {
    std::shared_ptr<gloo::transport::Device> dev;
};

struct ugloo {
    std::shared_ptr<gloo::Context> ctx;
    std::chrono::milliseconds timeout;
};

extern "C" {

ugloo_dev *ugloo_dev_create(const char *hostname, const char *iface, char *err, size_t cap) {
    try {
        gloo::transport::tcp::attr a;
        if (iface && *iface)
            a.iface = iface;
        else
            a.hostname = hostname;
        auto d = std::make_unique<ugloo_dev>();
        d->dev = gloo::transport::tcp::CreateDevice(a);
        return d.release();
    } catch (const std::exception &x) {
        put_err(err, cap, "creating the gloo TCP device", x);
        return nullptr;
    }
}

void ugloo_dev_free(ugloo_dev *d) { delete d; }

ugloo *ugloo_connect(ugloo_dev *d, ust_boot *b, const char *prefix, const int *granks, int rank,
                     int size, double timeout_s, char *err, size_t cap) {
    try {
        auto g = std::make_unique<ugloo>();
        g->timeout = std::chrono::milliseconds((long long)(timeout_s * 1000));
        auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
        ctx->setTimeout(g->timeout);
        BootStore store(b, prefix, std::vector<int>(granks, granks + size));
        ctx->connectFullMesh(store, d->dev);
        // Nobody leaves before every member's mesh is up: a member that dies right after its own
        // connect would otherwise fail a slower peer's connect instead of its first operation.
        gloo::BarrierOptions o(ctx);
        o.setTimeout(g->timeout);
        gloo::barrier(o);
        g->ctx = ctx;
        return g.release();
    } catch (const std::exception &x) {
        put_err(err, cap, "connecting the gloo group", x);
        return nullptr;
    }
}

void ugloo_free(ugloo *g) { delete g; }

int ugloo_allreduce_f32(ugloo *g, float *buf, size_t n, char *err, size_t cap) {
    try {
        gloo::AllreduceOptions o(g->ctx);
        o.setOutput(buf, n); // no input: in place
        o.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        o.setTimeout(g->timeout);
        gloo::allreduce(o);
        return 0;
    } catch (const std::exception &x) {
        put_err(err, cap, "gloo all_reduce", x);
        return -1;
    }
}

int ugloo_reduce_scatter_f32(ugloo *g, float *buf, float *out, size_t n, char *err, size_t cap) {
    const int p = g->ctx->size, r = g->ctx->rank;
    try {
        // Step s sends the partial sum of chunk (r-s-1) to the next member and adds the
        // previous member's partial sum of chunk (r-s-2) to ours; after p-1 steps chunk r has
        // every member's contribution, each added once (bus traffic (p-1)*n floats, as a ring).
        std::vector<float> tmp(n);
        auto all = g->ctx->createUnboundBuffer(buf, (size_t)p * n * sizeof(float));
        auto in = g->ctx->createUnboundBuffer(tmp.data(), n * sizeof(float));
        const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, 0);
        const int next = (r + 1) % p, prev = (r + p - 1) % p;
        for (int s = 0; s < p - 1; s++) {
            size_t cs = (size_t)((r - s - 1 + 2 * p) % p), cr = (size_t)((r - s - 2 + 2 * p) % p);
            all->send(next, slot, cs * n * sizeof(float), n * sizeof(float));
            in->recv(prev, slot, 0, n * sizeof(float));
            if (!in->waitRecv(g->timeout) || !all->waitSend(g->timeout))
                throw std::runtime_error("reduce-scatter transfer aborted");
            float *acc = buf + cr * n;
            for (size_t i = 0; i < n; i++) acc[i] += tmp[i];
        }
        std::memcpy(out, buf + (size_t)r * n, n * sizeof(float));
        return 0;
    } catch (const std::exception &x) {
        put_err(err, cap, "gloo reduce_scatter", x);
        return -1;
    }
}

int ugloo_allgather(ugloo *g, void *out, size_t bytes, char *err, size_t cap) {
    try {
        gloo::AllgatherOptions o(g->ctx);
        o.setOutput(static_cast<uint8_t *>(out), bytes * (size_t)g->ctx->size); // in place
        o.setTimeout(g->timeout);
        gloo::allgather(o);
        return 0;
    } catch (const std::exception &x) {
        put_err(err, cap, "gloo all_gather", x);
        return -1;
    }
}

int ugloo_broadcast(ugloo *g, void *buf, size_t bytes, int root, char *err, size_t cap) {
    try {
        gloo::BroadcastOptions o(g->ctx);
        o.setOutput(static_cast<uint8_t *>(buf), bytes);
        o.setRoot(root);
        o.setTimeout(g->timeout);
        gloo::broadcast(o);
        return 0;
    } catch (const std::exception &x) {
        put_err(err, cap, "gloo broadcast", x);
        return -1;
    }
}

int ugloo_barrier(ugloo *g, char *err, size_t cap) {
    try {
        gloo::BarrierOptions o(g->ctx);
        o.setTimeout(g->timeout);
        gloo::barrier(o);
        return 0;
    } catch (const std::exception &x) {
        put_err(err, cap, "gloo barrier", x);
        return -1;
    }
}

int ugloo_batch(ugloo *g, const ugloo_xfer *x, int n, int slot, char *err, size_t cap) {
    try {
        const uint64_t s = gloo::Slot::build(kBatchSlotPrefix, (uint32_t)slot);
        std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
        bufs.reserve((size_t)n);
        // Everything is posted before anything is waited on, so two members that send to each
        // other in one batch cannot deadlock.
        for (int i = 0; i < n; i++) {
            bufs.push_back(g->ctx->createUnboundBuffer(x[i].buf, x[i].bytes));
            if (x[i].is_send)
                bufs.back()->send(x[i].peer, s);
            else
                bufs.back()->recv(x[i].peer, s);
        }
        for (int i = 0; i < n; i++) {
            bool ok = x[i].is_send ? bufs[(size_t)i]->waitSend(g->timeout)
                                   : bufs[(size_t)i]->waitRecv(g->timeout);
            if (!ok) throw std::runtime_error("transfer aborted");
        }
        return 0;
    } catch (const std::exception &e) {
        put_err(err, cap, "gloo send/recv", e);
        return -1;
    }
}

} // extern "C"
