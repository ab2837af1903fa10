/* bench_load: loading a Hugging Face directory (or a GGUF file) against mmap-and-touch of its bytes.
 *
 *   bench_load -m MODEL [--repeats R] [--cold] [--quantize Q --threads N] [--json]
 *
 * Per repeat, in this order:
 *   touch   mmap every weight file, read one byte per 4 KiB page: the floor for a loader that
 *           uses the weights in place;
 *   load    dsp_model_load + the same one-byte-per-page read over every tensor through the model's
 *           own mappings (what `dspark` does on a terminal before the first token: prefault);
 *   lazy    dsp_model_load alone (metadata, checks, tokenizer; the pages come in at first use).
 * With --quantize, load also quantizes (on --threads threads) and that is the figure of interest.
 * --cold evicts the weight files from the page cache (posix_fadvise DONTNEED) before every
 * measurement, so both touch and load read the disk; otherwise everything is in the page cache
 * (warm). Reports medians, load / touch in wall and in process CPU time (on a shared machine the
 * wall time mostly measures the neighbours: cpu_share = CPU time / (wall time x threads)), and the bytes
 * of tensors the model copied or widened (owned) rather than used in place. */
#include "bench_util.h"
#include "dspark.h"
#include "core/file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/model.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

/* the weight files of a model: a GGUF file, or a directory's safetensors files */
static int weight_files(const char *path, char ***out) {
    *out = NULL;
    if (!dsp_file_is_dir(path)) {
        *out = malloc(sizeof **out);
        (*out)[0] = strdup(path);
        return 1;
    }
    dsp_st *st;
    if (dsp_st_open(path, &st)) return -1;
    int n = dsp_st_n_files(st);
    *out = malloc((size_t)n * sizeof **out);
    for (int i = 0; i < n; i++) (*out)[i] = strdup(dsp_st_file_path(st, i));
    dsp_st_destroy(st);
    return n;
}

static void evict(char **files, int n) {
    for (int i = 0; i < n; i++) {
        int fd = open(files[i], O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static uint64_t touch_range(const uint8_t *p, uint64_t n) {
    volatile uint8_t sink = 0;
    for (uint64_t off = 0; off < n; off += PAGE) sink ^= p[off];
    if (n) sink ^= p[n - 1];
    return sink;
}

/* open, mmap and touch every file; the clock stops before the unmapping (as load's does before
 * the model is destroyed) */
static double run_touch(char **files, int n, uint64_t *bytes) {
    void **maps = calloc((size_t)n, sizeof *maps);
    size_t *sizes = calloc((size_t)n, sizeof *sizes);
    double t0 = bench_now();
    *bytes = 0;
    for (int i = 0; i < n; i++) {
        int fd = open(files[i], O_RDONLY);
        off_t sz = fd < 0 ? 0 : lseek(fd, 0, SEEK_END);
        void *p = sz > 0 ? mmap(NULL, (size_t)sz, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (p != MAP_FAILED) {
            touch_range(p, (uint64_t)sz);
            maps[i] = p, sizes[i] = (size_t)sz;
            *bytes += (uint64_t)sz;
        }
        if (fd >= 0) close(fd);
    }
    double t = bench_now() - t0;
    for (int i = 0; i < n; i++)
        if (maps[i]) munmap(maps[i], sizes[i]);
    free(maps);
    free(sizes);
    return t;
}

static dsp_model *load(const char *path, const char *quant, int threads) {
    dsp_model_params mp = dsp_model_default_params();
    mp.quantize = quant;
    mp.n_threads = threads;
    dsp_model *m;
    if (dsp_model_load(path, &mp, &m)) {
        fprintf(stderr, "bench_load: %s\n", dsp_last_error());
        exit(1);
    }
    return m;
}

/* every tensor the forward pass reads, through the model (mapped or owned) */
static void touch_model(const dsp_model *m) {
    uint64_t n = m->gguf ? dsp_gguf_n_tensors(m->gguf) : dsp_st_n_tensors(m->st);
    for (uint64_t i = 0; i < n; i++) {
        const dsp_tensor *t = m->gguf ? dsp_gguf_tensor_at(m->gguf, i) : dsp_st_tensor_at(m->st, i);
        touch_range(t->data, t->nbytes);
    }
    for (int i = 0; i < m->n_own; i++)
        if (m->own[i].t.data) touch_range(m->own[i].t.data, m->own[i].t.nbytes);
}

int main(int argc, char **argv) {
    const char *path = NULL, *quant = NULL;
    int repeats = 5, threads = 2;
    bool json = false, cold = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quantize") && i + 1 < argc) quant = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cold")) cold = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else path = NULL, i = argc;
    }
    if (!path || repeats < 1 || repeats > 100 || threads < 1) {
        fprintf(stderr, "usage: bench_load -m MODEL [--repeats R] [--cold] [--quantize Q] [--threads N] [--json]\n");
        return 2;
    }
    char **files;
    int nf = weight_files(path, &files);
    if (nf < 0) {
        fprintf(stderr, "bench_load: %s\n", dsp_last_error());
        return 1;
    }
    double *tt = calloc((size_t)repeats, sizeof *tt), *tl = calloc((size_t)repeats, sizeof *tl), *tz = calloc((size_t)repeats, sizeof *tz),
           *cl = calloc((size_t)repeats, sizeof *cl), *ct = calloc((size_t)repeats, sizeof *ct);
    uint64_t bytes = 0, owned = 0;
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    for (int r = 0; r < repeats; r++) {
        if (cold) evict(files, nf);
        double c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
        tt[r] = run_touch(files, nf, &bytes);
        ct[r] = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (cold) evict(files, nf);
        double t0 = bench_now();
        c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
        dsp_model *m = load(path, quant, threads);
        touch_model(m);
        tl[r] = bench_now() - t0; /* the clocks stop before unmapping, in both */
        cl[r] = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
        owned = 0;
        for (int i = 0; i < m->n_own; i++) owned += m->own[i].t.data ? m->own[i].t.nbytes : 0;
        dsp_model_destroy(m);
        if (cold) evict(files, nf);
        t0 = bench_now();
        m = load(path, quant, threads);
        tz[r] = bench_now() - t0;
        dsp_model_destroy(m);
    }
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 1e-6 * (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec);
    double mt = bench_median(tt, repeats), ml = bench_median(tl, repeats), mz = bench_median(tz, repeats), mc = bench_median(cl, repeats), mct = bench_median(ct, repeats), load1 = 0;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1) load1 = 0;
        fclose(la);
    }
    if (json) {
        printf("{\"bench\": \"load\", \"model\": \"%s\", \"cache\": \"%s\", \"quantize\": \"%s\", \"threads\": %d, \"repeats\": %d, "
               "\"weight_bytes\": %llu, \"owned_bytes\": %llu, \"touch_s_median\": %.4f, \"load_s_median\": %.4f, \"lazy_load_s_median\": %.4f, "
               "\"load_vs_touch\": %.3f, \"touch_gb_s\": %.2f, \"touch_cpu_s_median\": %.3f, \"load_cpu_s_median\": %.3f, \"load_vs_touch_cpu\": %.3f, "
               "\"load_cpu_share\": %.2f, \"process_cpu_s\": %.2f, "
               "\"loadavg_1m\": %.2f}\n",
               path, cold ? "cold" : "warm", quant ? quant : "none", threads, repeats, (unsigned long long)bytes, (unsigned long long)owned, mt, ml, mz,
               ml / mt, (double)bytes / 1e9 / mt, mct, mc, mc / mct, mc / (ml * threads), cpu, load1);
    } else {
        printf("%s: %.2f GB in %d file%s, %s page cache, %d repeats%s%s (threads %d)\n", path, (double)bytes / 1e9, nf, nf == 1 ? "" : "s",
               cold ? "cold" : "warm", repeats, quant ? ", --quantize " : "", quant ? quant : "", threads);
        printf("  mmap + touch   %8.3f s  (%.2f GB/s)\n  load + touch   %8.3f s  (%.3fx)\n  load (lazy)    %8.3f s\n", mt, (double)bytes / 1e9 / mt, ml,
               ml / mt, mz);
        printf("  CPU time: touch %.3f s, load %.3f s (%.3fx; the load got %.0f%% of %d threads' wall time)\n", mct, mc, mc / mct,
               100 * mc / (ml * threads), threads);
        printf("  owned (copied or widened) tensor bytes: %llu; load average %.2f\n", (unsigned long long)owned, load1);
    }
    for (int i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(tt), free(tl), free(tz), free(cl), free(ct);
    return 0;
}
