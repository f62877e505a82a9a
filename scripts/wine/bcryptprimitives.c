/* A stand-in for Windows' bcryptprimitives.dll, which wine 8.0 does not ship. Rust-built Windows
 * binaries (the xllamacpp wheel's dependencies among them) import ProcessPrng from it for random bytes;
 * without the DLL the import fails at load. Built by scripts/wine-setup.sh with mingw-w64 and used only
 * in the test prefix: on real Windows the system's own DLL is loaded. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length); /* RtlGenRandom, in advapi32 */

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG step = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, step))
            return FALSE;
        data += step;
        length -= step;
    }
    return TRUE;
}
