/* main.c -- the tokenmill command line: run, chat, tokenize, inspect. */
#include <stdio.h>

int main(void) {
    fprintf(stderr, "usage: tokenmill <run|chat|tokenize|inspect> ...\n");
    return 2;
}
