/* mpi_allreduce_bench: OpenMPI's MPI_Allreduce (float sum) timed the way `ustrain bench comm`
 * times its all-reduce (one warm-up, then N iterations, the slowest rank's mean), for the
 * comparison that `make bench-comm` prints. Built with mpicc by that target only.
 * Usage: mpirun -np N mpi_allreduce_bench [min_bytes] [max_bytes]
 * Output (rank 0): "mpi_allreduce BYTES TIME_US BUSBW_GBS" per size. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t minb = argc > 1 ? strtoull(argv[1], NULL, 0) : 4096;
    size_t maxb = argc > 2 ? strtoull(argv[2], NULL, 0) : 64u << 20;
    float *a = malloc(maxb), *b = malloc(maxb);
    for (size_t i = 0; i < maxb / 4; i++) a[i] = (float)((rank * 131 + i * 7) % 17) - 8;
    for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
        int count = (int)(bytes / 4);
        int iters = bytes >= (32u << 20) ? 5 : bytes >= (1u << 20) ? 20 : 100;
        MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (int it = 0; it < iters; it++)
            MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t = (MPI_Wtime() - t) / iters;
        double tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("mpi_allreduce %zu %.1f %.3f\n", bytes, tmax * 1e6,
                   (double)bytes / tmax * 2.0 * (n - 1) / n / 1e9);
    }
    free(a), free(b);
    MPI_Finalize();
    return 0;
}
