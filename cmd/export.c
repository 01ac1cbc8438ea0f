/* ustrain export CKPT --to hf OUT: a checkpoint in the Hugging Face transformers layout
 * (model.safetensors + config.json), loadable by transformers' from_pretrained and vLLM. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "error.h"
#include "export.h"

static const char *EXPORT_USAGE =
    "usage: ustrain export CKPT --to hf OUT\n"
    "  CKPT  a checkpoint step directory (e.g. runs/tiny/ckpt/step_50), or a checkpoint\n"
    "        directory (its newest finished step is exported)\n"
    "  OUT   directory for model.safetensors + config.json (created when missing)\n";

static int export_usage(const char *what, const char *arg) {
    return cmd_usage_error("ustrain", EXPORT_USAGE, what, arg);
}

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *to = NULL;
    if (cmd_wants_help(argc, argv)) return cmd_print_usage(EXPORT_USAGE);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--to")) {
            if (i + 1 >= argc) return export_usage("%s needs a value (hf)", argv[i]);
            to = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return export_usage("unknown option %s for export", argv[i]);
        } else if (!ckpt) {
            ckpt = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return export_usage("unexpected argument %s", argv[i]);
        }
    }
    if (!to) return export_usage("%s", "missing --to FORMAT (supported: hf)");
    if (strcmp(to, "hf") != 0)
        return export_usage("unknown export format --to %s (supported: hf)", to);
    if (!ckpt || !out) return export_usage("%s", "missing CKPT or OUT");
    ust_err e;
    int rc = export_hf(ckpt, out, &e);
    if (rc) {
        fprintf(stderr, "ustrain: error: %s\n", e.msg);
        return rc;
    }
    printf("exported %s to %s (model.safetensors + config.json, Hugging Face transformers "
           "layout)\n",
           ckpt, out);
    return 0;
}
