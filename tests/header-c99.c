/* Compiled by the header-c99 test with gcc -std=c99 -Wall -Wextra -Werror -pedantic. */
#include "forge.h"

int main(void) {
    forge_ctx *ctx = forge_ctx_new();
    forge_tensor *t = forge_tensor_new_2d(ctx, FORGE_TYPE_F32, 4, 2);
    (void)t;
    forge_ctx_free(ctx);
    return 0;
}
