/*
 * A stand-in for NVML (libnvidia-ml.so.1) with the few calls the agent
 * uses, over a fixture the test controls: the file "<this library's
 * path>.fixture", read again at every call, one GPU per line:
 *
 *     NAME UUID ENERGY_MJ POWER_MW
 *
 * ENERGY_MJ "-": the GPU has no energy counter (NVML_ERROR_NOT_SUPPORTED);
 * "rate:R": a counter that advances R millijoules a second (R milliwatts
 * drawn all along) on the monotonic clock, for a whole trial's run;
 * "fail" (either field): the call fails (NVML_ERROR_GPU_IS_LOST). A line
 * "init-fail" makes nvmlInit fail (NVML_ERROR_DRIVER_NOT_LOADED).
 * Built by agent/tests/gpu_nvml.rs with the system's cc; never shipped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum {
    OK = 0,
    INVALID_ARGUMENT = 2,
    NOT_SUPPORTED = 3,
    DRIVER_NOT_LOADED = 9,
    GPU_IS_LOST = 15,
    UNKNOWN = 999,
};

struct gpu {
    char name[96];
    char uuid[96];
    char energy[32];
    char power[32];
};

#define MAX_GPUS 16

/* Reads the fixture; the number of GPUs, or -1 when it cannot be read. */
static int load(struct gpu *gpus, int *init_fail) {
    Dl_info info;
    char path[4096];
    char line[512];
    int n = 0;
    *init_fail = 0;
    if (!dladdr((void *)load, &info) || !info.dli_fname) return -1;
    snprintf(path, sizeof path, "%s.fixture", info.dli_fname);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (n < MAX_GPUS && fgets(line, sizeof line, f)) {
        if (strncmp(line, "init-fail", 9) == 0) {
            *init_fail = 1;
            continue;
        }
        struct gpu *g = &gpus[n];
        if (sscanf(line, "%95s %95s %31s %31s", g->name, g->uuid, g->energy, g->power) == 4) n++;
    }
    fclose(f);
    return n;
}

static nvmlReturn_t gpu_of(nvmlDevice_t device, struct gpu *out) {
    struct gpu gpus[MAX_GPUS];
    int init_fail;
    int n = load(gpus, &init_fail);
    uintptr_t i = (uintptr_t)device;
    if (n < 0) return UNKNOWN;
    if (i == 0 || i > (uintptr_t)n) return INVALID_ARGUMENT;
    *out = gpus[i - 1];
    return OK;
}

static nvmlReturn_t copy(char *dst, unsigned int len, const char *src) {
    if (!dst || strlen(src) + 1 > len) return INVALID_ARGUMENT;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

nvmlReturn_t nvmlInit_v2(void) {
    struct gpu gpus[MAX_GPUS];
    int init_fail;
    if (load(gpus, &init_fail) < 0) return UNKNOWN;
    return init_fail ? DRIVER_NOT_LOADED : OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    return copy(version, len, "580.00.standin");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    struct gpu gpus[MAX_GPUS];
    int init_fail;
    int n = load(gpus, &init_fail);
    if (n < 0) return UNKNOWN;
    *count = (unsigned int)n;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    unsigned int count;
    nvmlReturn_t r = nvmlDeviceGetCount_v2(&count);
    if (r != OK) return r;
    if (index >= count) return INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(uintptr_t)(index + 1);
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int len) {
    struct gpu g;
    nvmlReturn_t r = gpu_of(device, &g);
    return r != OK ? r : copy(name, len, g.name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int len) {
    struct gpu g;
    nvmlReturn_t r = gpu_of(device, &g);
    return r != OK ? r : copy(uuid, len, g.uuid);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    struct gpu g;
    nvmlReturn_t r = gpu_of(device, &g);
    if (r != OK) return r;
    if (strcmp(g.energy, "-") == 0) return NOT_SUPPORTED;
    if (strcmp(g.energy, "fail") == 0) return GPU_IS_LOST;
    if (strncmp(g.energy, "rate:", 5) == 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double seconds = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
        *energy = (unsigned long long)(strtod(g.energy + 5, NULL) * seconds);
        return OK;
    }
    *energy = strtoull(g.energy, NULL, 10);
    return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    struct gpu g;
    nvmlReturn_t r = gpu_of(device, &g);
    if (r != OK) return r;
    if (strcmp(g.power, "-") == 0) return NOT_SUPPORTED;
    if (strcmp(g.power, "fail") == 0) return GPU_IS_LOST;
    *power = (unsigned int)strtoul(g.power, NULL, 10);
    return OK;
}
