/* emulator build: the CUDA headers are emu_cuda.h (C++) or emu_rt.h (C) */
#ifdef __cplusplus
#include "../emu_cuda.h"
#else
#include "../emu_rt.h"
#endif
