/* emulator build: the runtime and NCCL are emu_rt.h */
#include "../emu_rt.h"
