/* examples/simple.c - the forge C API in one page (C99): load a model, generate a few tokens,
 * train a LoRA adapter on a string for a few steps, generate again, save the adapter as PEFT.
 *
 *   usage: simple MODEL [ADAPTER_DIR [BACKEND]]
 *   MODEL: an HF directory (with tokenizer.json) or a GGUF file; ADAPTER_DIR: where the adapter
 *   goes (default simple-adapter); BACKEND: cpu, cuda, cuda:N (default: CUDA when present).
 *
 * Build against an installed forge: cc -std=c99 simple.c $(pkg-config --cflags --libs forge)
 */
#include <forge.h>

#include <stdio.h>

#define TRY(call)                                                                  \
    do {                                                                           \
        if ((call) != FORGE_OK) {                                                  \
            fprintf(stderr, "simple: %s: %s\n", #call, forge_model_error(model)); \
            forge_model_free(model);                                               \
            return 1;                                                              \
        }                                                                          \
    } while (0)

int main(int argc, char **argv) {
    const char *prompt = "The quick brown fox";
    const char *text = "The quick brown fox jumps over the lazy dog.";
    const char *adapter = argc > 2 ? argv[2] : "simple-adapter";
    const char *backend = argc > 3 ? argv[3] : NULL;
    forge_model_params params = forge_model_default_params();
    forge_model *model = NULL;
    char out[256];
    float loss = 0.0f;
    int step;

    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [ADAPTER_DIR [BACKEND]]\n", argv[0]);
        return 2;
    }
    printf("forge %s\n", forge_version());

    /* load: an HF directory or a GGUF file; 64 tokens are plenty for this example */
    params.n_ctx = 64;
    if (forge_model_load(argv[1], backend, &params, &model) != FORGE_OK) {
        fprintf(stderr, "simple: %s\n", forge_model_error(NULL));
        return 1;
    }

    /* generate 8 tokens greedily (sampling NULL) */
    TRY(forge_model_generate(model, prompt, 8, NULL, out, sizeof out));
    printf("before: %s|%s\n", prompt, out);

    /* a rank-8 adapter on every projection, then a few steps on one string */
    TRY(forge_model_add_lora(model, 8, 16.0f, FORGE_LORA_ALL));
    for (step = 1; step <= 5; step++) {
        TRY(forge_model_train_step(model, text, 1e-2f, &loss));
        printf("step %d: loss %.4f\n", step, loss);
    }

    /* the adapter changes what the model says */
    TRY(forge_model_generate(model, prompt, 8, NULL, out, sizeof out));
    printf("after:  %s|%s\n", prompt, out);

    TRY(forge_model_save_adapter(model, adapter));
    printf("adapter saved to %s\n", adapter);
    forge_model_free(model);
    return 0;
}
