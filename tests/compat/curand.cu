/* curand: the cuRAND host API generating on the device with fixed seeds
 * (XORWOW, Philox4x32-10, MRG32k3a; bits, uniform and normal floats), checked
 * for determinism (a new generator with the same seed repeats the sequence),
 * for agreement with the same generator run on the host CPU
 * (curandCreateGeneratorHost), and for plausible statistics. The checksums
 * printed are those of the sequences themselves: the same natively and
 * through rgpu. */
#include "compat.h"

#include <curand.h>
#include <math.h>

#define CR(call)                                                                          \
    do {                                                                                  \
        curandStatus_t cr_ = (call);                                                      \
        if (cr_ != CURAND_STATUS_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d: %s returned curand status %d\n", __FILE__, __LINE__,  \
                    #call, (int)cr_);                                                     \
            return false;                                                                 \
        }                                                                                 \
    } while (0)

static const size_t N = 1 << 16;

/* Generates N 32-bit values with RNG on the device (into host[]) or, when
 * on_host, on the CPU. */
static bool bits(curandRngType_t rng, unsigned long long seed, bool on_host, unsigned *host) {
    curandGenerator_t gen;
    unsigned *d = NULL;
    if (on_host) {
        CR(curandCreateGeneratorHost(&gen, rng));
    } else {
        CR(curandCreateGenerator(&gen, rng));
        CK(cudaMalloc(&d, N * sizeof(unsigned)));
    }
    CR(curandSetPseudoRandomGeneratorSeed(gen, seed));
    CR(curandGenerate(gen, on_host ? host : d, N));
    if (!on_host) {
        CK(cudaMemcpy(host, d, N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        CK(cudaFree(d));
    }
    CR(curandDestroyGenerator(gen));
    return true;
}

static unsigned checksum(const unsigned *v) {
    unsigned h = 2166136261u;
    for (size_t i = 0; i < N; i++) h = (h ^ v[i]) * 16777619u;
    return h;
}

/* Prints the device sequence's checksum (FNV-1a over the 32-bit values),
 * then whether it repeats and whether the host generator agrees. */
static void generator(const char *name, curandRngType_t rng, unsigned long long seed) {
    static unsigned a[N], b[N], c[N];
    bool ok = bits(rng, seed, false, a) && bits(rng, seed, false, b) && bits(rng, seed, true, c);
    bool repeat = ok, host = ok;
    for (size_t i = 0; ok && i < N; i++) {
        repeat = repeat && a[i] == b[i];
        host = host && a[i] == c[i];
    }
    if (ok)
        printf("curand: %s seed %llu: checksum %08x\n", name, seed, checksum(a));
    else
        printf("curand: %s seed %llu: generation failed\n", name, seed);
    printf("curand: %s same sequence from a new generator %s\n", name, repeat ? "PASS" : "FAIL");
    printf("curand: %s device sequence equals the host generator's %s\n", name,
           host ? "PASS" : "FAIL");
    compat_passed += repeat + host;
    compat_failed += !repeat + !host;
}

static bool distributions(void) {
    curandGenerator_t gen;
    CR(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    CR(curandSetPseudoRandomGeneratorSeed(gen, 2024));
    float *d;
    static float v[N];
    CK(cudaMalloc(&d, N * sizeof(float)));
    CR(curandGenerateUniform(gen, d, N));
    CK(cudaMemcpy(v, d, sizeof v, cudaMemcpyDeviceToHost));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) {
        EXPECT(v[i] > 0.0f && v[i] <= 1.0f);
        sum += v[i];
    }
    EXPECT(fabs(sum / N - 0.5) < 0.01);
    CR(curandGenerateNormal(gen, d, N, 10.0f, 2.0f));
    CK(cudaMemcpy(v, d, sizeof v, cudaMemcpyDeviceToHost));
    double mean = 0.0, var = 0.0;
    for (size_t i = 0; i < N; i++) mean += v[i];
    mean /= N;
    for (size_t i = 0; i < N; i++) var += (v[i] - mean) * (v[i] - mean);
    var /= N;
    EXPECT(fabs(mean - 10.0) < 0.05 && fabs(sqrt(var) - 2.0) < 0.05);
    CK(cudaFree(d));
    CR(curandDestroyGenerator(gen));
    return true;
}

static bool on_a_stream(void) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    curandGenerator_t gen;
    CR(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_XORWOW));
    CR(curandSetStream(gen, s));
    CR(curandSetPseudoRandomGeneratorSeed(gen, 1234));
    unsigned *d;
    static unsigned on_stream[N], reference[N];
    CK(cudaMalloc(&d, N * sizeof(unsigned)));
    CR(curandGenerate(gen, d, N));
    CK(cudaMemcpyAsync(on_stream, d, sizeof on_stream, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaFree(d));
    CR(curandDestroyGenerator(gen));
    CK(cudaStreamDestroy(s));
    if (!bits(CURAND_RNG_PSEUDO_XORWOW, 1234, false, reference)) return false;
    for (size_t i = 0; i < N; i++) EXPECT(on_stream[i] == reference[i]);
    return true;
}

int main(void) {
    compat_start();
    generator("XORWOW", CURAND_RNG_PSEUDO_XORWOW, 1234);
    generator("PHILOX4_32_10", CURAND_RNG_PSEUDO_PHILOX4_32_10, 42);
    generator("MRG32K3A", CURAND_RNG_PSEUDO_MRG32K3A, 7);
    check("curand: uniform in (0, 1] and normal(10, 2) statistics", distributions);
    check("curand: generation on a stream", on_a_stream);
    return finish("curand");
}
