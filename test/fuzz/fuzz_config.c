/* libFuzzer target: the YAML run-config loader (core/base/config.c).
 * The input is a YAML document; its first line, when it starts with "#set ", is also applied as
 * a --set override. Loading, --set and validation must either succeed or fail with a message:
 * never crash, read out of bounds, leak or leave the config half-formed (the dump must work). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ust_config c;
    ust_err e;
    cfg_defaults(&c);
    e.msg[0] = 0;
    if (cfg_load_string(&c, text, "fuzz.yaml", &e) && !e.msg[0]) abort(); /* a failure says why */
    /* --set also over the defaults a failed load left: a "#set" line alone is an empty config */
    if (!strncmp(text, "#set ", 5)) {
        char *nl = strchr(text, '\n');
        if (nl) *nl = 0;
        cfg_set(&c, text + 5, &e);
    }
    for (int world = 0; world <= 2; world++) cfg_validate(&c, world, &e);
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        cfg_dump(&c, null);
        fclose(null);
    }
    free(text);
    return 0;
}
