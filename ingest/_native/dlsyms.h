/* A shared library opened at run time with every function the caller needs, or none: libcuda for the native engine
 * (engine.c), zlib for the PNG mask decoder (png_decode.h). Building needs no header of either library. */
#ifndef INGEST_DLSYMS_H
#define INGEST_DLSYMS_H

#include <dlfcn.h>
#include <stddef.h>

typedef struct {
    const char *name;
    void **slot;
} ing_symbol;

/* dlopen(name) and dlsym of each symbol into its slot: the handle, or NULL (the library missing, or a symbol: then
 * every slot is set back to NULL and the library closed; *missing says which of the two). */
static void *ing_dlopen_all(const char *name, const ing_symbol *symbols, size_t count, int *missing) {
    *missing = 0;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return NULL;
    for (size_t k = 0; k < count; ++k) {
        *symbols[k].slot = dlsym(lib, symbols[k].name);
        if (*symbols[k].slot == NULL) {
            for (size_t q = 0; q < count; ++q)
                *symbols[q].slot = NULL;
            dlclose(lib);
            *missing = 1;
            return NULL;
        }
    }
    return lib;
}

#endif
