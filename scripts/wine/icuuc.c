/* A stand-in for Windows' icuuc.dll (the system ICU that Windows 10 1903 and later ship), which wine 8.0
 * does not have. Qt6Core.dll imports ICU's converter functions from it for legacy text encodings; without
 * the DLL every PySide6 module fails to load. This one offers no converters at all: opening one fails
 * with ICU's "file access" error and the list of converters is empty, so Qt keeps to its own UTF-8/16/32
 * and Latin-1 codecs, which is all Switchyard uses. Built by scripts/wine-setup.sh with mingw-w64 and
 * used only in the test prefix: on real Windows the system's own DLL is loaded. */
#include <stddef.h>
#include <stdint.h>

typedef int UErrorCode;
typedef uint16_t UChar;
typedef struct UConverter UConverter;
typedef void (*UConverterCallback)(void);

enum { U_ZERO_ERROR = 0, U_FILE_ACCESS_ERROR = 4, U_UNSUPPORTED_ERROR = 16 };

static void fail(UErrorCode *err, UErrorCode code)
{
    if (err != NULL && *err <= U_ZERO_ERROR)
        *err = code;
}

__declspec(dllexport) UConverter *ucnv_open(const char *name, UErrorCode *err)
{
    (void)name;
    fail(err, U_FILE_ACCESS_ERROR);
    return NULL;
}

__declspec(dllexport) void ucnv_close(UConverter *cnv) { (void)cnv; }
__declspec(dllexport) void ucnv_reset(UConverter *cnv) { (void)cnv; }
__declspec(dllexport) int8_t ucnv_getMaxCharSize(const UConverter *cnv) { (void)cnv; return 1; }

__declspec(dllexport) const char *ucnv_getName(const UConverter *cnv, UErrorCode *err)
{
    (void)cnv;
    fail(err, U_UNSUPPORTED_ERROR);
    return "";
}

__declspec(dllexport) void ucnv_getToUCallBack(const UConverter *cnv, UConverterCallback *action, const void **ctx)
{
    (void)cnv;
    if (action != NULL)
        *action = NULL;
    if (ctx != NULL)
        *ctx = NULL;
}

__declspec(dllexport) void ucnv_getFromUCallBack(const UConverter *cnv, UConverterCallback *action, const void **ctx)
{
    ucnv_getToUCallBack(cnv, action, ctx);
}

__declspec(dllexport) void ucnv_setToUCallBack(UConverter *cnv, UConverterCallback action, const void *ctx,
                                               UConverterCallback *old, const void **oldCtx, UErrorCode *err)
{
    (void)cnv; (void)action; (void)ctx;
    ucnv_getToUCallBack(NULL, old, oldCtx);
    fail(err, U_UNSUPPORTED_ERROR);
}

__declspec(dllexport) void ucnv_setFromUCallBack(UConverter *cnv, UConverterCallback action, const void *ctx,
                                                 UConverterCallback *old, const void **oldCtx, UErrorCode *err)
{
    ucnv_setToUCallBack(cnv, action, ctx, old, oldCtx, err);
}

__declspec(dllexport) void ucnv_fromUnicode(UConverter *cnv, char **target, const char *targetLimit,
                                            const UChar **source, const UChar *sourceLimit, int32_t *offsets,
                                            int8_t flush, UErrorCode *err)
{
    (void)cnv; (void)target; (void)targetLimit; (void)source; (void)sourceLimit; (void)offsets; (void)flush;
    fail(err, U_UNSUPPORTED_ERROR);
}

__declspec(dllexport) void ucnv_toUnicode(UConverter *cnv, UChar **target, const UChar *targetLimit,
                                          const char **source, const char *sourceLimit, int32_t *offsets,
                                          int8_t flush, UErrorCode *err)
{
    (void)cnv; (void)target; (void)targetLimit; (void)source; (void)sourceLimit; (void)offsets; (void)flush;
    fail(err, U_UNSUPPORTED_ERROR);
}

__declspec(dllexport) int32_t ucnv_countAvailable(void) { return 0; }
__declspec(dllexport) const char *ucnv_getAvailableName(int32_t n) { (void)n; return NULL; }

__declspec(dllexport) const char *ucnv_getStandardName(const char *name, const char *standard, UErrorCode *err)
{
    (void)name; (void)standard;
    fail(err, U_FILE_ACCESS_ERROR);
    return NULL;
}

__declspec(dllexport) int32_t ucnv_toUCountPending(const UConverter *cnv, UErrorCode *err)
{
    (void)cnv; (void)err;
    return 0;
}

__declspec(dllexport) int32_t ucnv_fromUCountPending(const UConverter *cnv, UErrorCode *err)
{
    (void)cnv; (void)err;
    return 0;
}

/* the callbacks Qt passes to ucnv_set*CallBack: never called, since no converter opens */
__declspec(dllexport) void ucnv_cbToUWriteUChars(void *args, const UChar *source, int32_t length, int32_t offset,
                                                 UErrorCode *err)
{
    (void)args; (void)source; (void)length; (void)offset;
    fail(err, U_UNSUPPORTED_ERROR);
}

__declspec(dllexport) void ucnv_cbFromUWriteUChars(void *args, const UChar **source, const UChar *sourceLimit,
                                                   int32_t offset, UErrorCode *err)
{
    (void)args; (void)source; (void)sourceLimit; (void)offset;
    fail(err, U_UNSUPPORTED_ERROR);
}

__declspec(dllexport) void UCNV_TO_U_CALLBACK_SUBSTITUTE(void) {}
__declspec(dllexport) void UCNV_FROM_U_CALLBACK_SUBSTITUTE(void) {}
