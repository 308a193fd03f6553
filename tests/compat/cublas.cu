/* cublas: a small cuBLAS check (cuBLAS asks the driver for more private
 * export tables than the runtime alone, so it is a program of its own):
 * SGEMM and DGEMM on odd shapes, with and without transposes, SAXPY and
 * SDOT, on a stream. Inputs are small integers, so every result is exact
 * whatever the summation order (TF32 included). */
#include "compat.h"

#include <cublas_v2.h>

#define CB(call)                                                                          \
    do {                                                                                  \
        cublasStatus_t cb_ = (call);                                                      \
        if (cb_ != CUBLAS_STATUS_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d: %s returned cublas status %d\n", __FILE__, __LINE__,  \
                    #call, (int)cb_);                                                     \
            return false;                                                                 \
        }                                                                                 \
    } while (0)

static cublasHandle_t handle;
static cudaStream_t stream;

static bool create(void) {
    CK(cudaStreamCreate(&stream));
    CB(cublasCreate(&handle));
    CB(cublasSetStream(handle, stream));
    int version = 0;
    CB(cublasGetVersion(handle, &version));
    EXPECT(version >= 130000);
    return true;
}

/* C (m x n) = alpha * op(A) * op(B) + beta * C, column-major, checked
 * against a host loop. op(A) is m x k, op(B) is k x n. */
template <typename T>
static bool gemm_case(int m, int n, int k, bool trans_a, bool trans_b, T alpha, T beta) {
    const int lda = trans_a ? k : m, ldb = trans_b ? n : k, ldc = m;
    const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    T *a = new T[lda * a_cols], *b = new T[ldb * b_cols], *c = new T[ldc * n], *r = new T[ldc * n];
    for (int i = 0; i < lda * a_cols; i++) a[i] = (T)((i * 7) % 11 - 5);
    for (int i = 0; i < ldb * b_cols; i++) b[i] = (T)((i * 5) % 13 - 6);
    for (int i = 0; i < ldc * n; i++) c[i] = (T)(i % 9 - 4);
    T *da, *db, *dc;
    CK(cudaMalloc(&da, sizeof(T) * lda * a_cols));
    CK(cudaMalloc(&db, sizeof(T) * ldb * b_cols));
    CK(cudaMalloc(&dc, sizeof(T) * ldc * n));
    CK(cudaMemcpy(da, a, sizeof(T) * lda * a_cols, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, sizeof(T) * ldb * b_cols, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dc, c, sizeof(T) * ldc * n, cudaMemcpyHostToDevice));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if constexpr (sizeof(T) == 4)
        CB(cublasSgemm(handle, op_a, op_b, m, n, k, &alpha, da, lda, db, ldb, &beta, dc, ldc));
    else
        CB(cublasDgemm(handle, op_a, op_b, m, n, k, &alpha, da, lda, db, ldb, &beta, dc, ldc));
    CK(cudaMemcpyAsync(r, dc, sizeof(T) * ldc * n, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    bool ok = true;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            T sum = 0;
            for (int p = 0; p < k; p++) {
                T av = trans_a ? a[p + i * lda] : a[i + p * lda];
                T bv = trans_b ? b[j + p * ldb] : b[p + j * ldb];
                sum += av * bv;
            }
            if (r[i + j * ldc] != alpha * sum + beta * c[i + j * ldc]) ok = false;
        }
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    delete[] a;
    delete[] b;
    delete[] c;
    delete[] r;
    EXPECT(ok);
    return true;
}

static bool sgemm(void) {
    return gemm_case<float>(128, 96, 64, false, false, 1.0f, 0.0f) &&
           gemm_case<float>(33, 17, 250, true, false, 2.0f, -1.0f) &&
           gemm_case<float>(200, 129, 31, false, true, -0.5f, 3.0f);
}

static bool dgemm(void) { return gemm_case<double>(65, 77, 99, true, true, 1.0, 1.0); }

static bool saxpy_sdot(void) {
    const int n = 4000;
    static float x[n], y[n];
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i % 5);
        y[i] = (float)(i % 3);
    }
    float *dx, *dy;
    CK(cudaMalloc(&dx, sizeof x));
    CK(cudaMalloc(&dy, sizeof y));
    CB(cublasSetVector(n, sizeof(float), x, 1, dx, 1));
    CB(cublasSetVector(n, sizeof(float), y, 1, dy, 1));
    const float alpha = 2.0f;
    CB(cublasSaxpy(handle, n, &alpha, dx, 1, dy, 1));
    float dot = 0.0f;
    CB(cublasSdot(handle, n, dx, 1, dy, 1, &dot));
    static float back[n];
    CB(cublasGetVector(n, sizeof(float), dy, 1, back, 1));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    double want_dot = 0.0;
    for (int i = 0; i < n; i++) {
        EXPECT(back[i] == 2.0f * x[i] + y[i]);
        want_dot += (double)x[i] * back[i];
    }
    EXPECT(dot == (float)want_dot);
    return true;
}

static bool destroy(void) {
    CB(cublasDestroy(handle));
    CK(cudaStreamDestroy(stream));
    return true;
}

int main(void) {
    compat_start();
    check("cublas: cublasCreate, cublasSetStream, version >= 13", create);
    check("cublas: SGEMM 128x96x64, 33x17x250 (A^T), 200x129x31 (B^T)", sgemm);
    check("cublas: DGEMM 65x77x99 (A^T B^T)", dgemm);
    check("cublas: SAXPY and SDOT", saxpy_sdot);
    check("cublas: cublasDestroy", destroy);
    return finish("cublas");
}
