// SPDX-License-Identifier: MIT
/*
 * The replay driver of the fuzz targets: a main() for gcc builds (and any
 * build without libFuzzer) that runs every file named on the command line,
 * or found (not recursively) in a directory named there, through the
 * target's LLVMFuzzerTestOneInput once, in name order.  The meson tests of
 * suite 'fuzz' run it on fuzz/corpus/<target>/ so that each checked-in seed
 * and crash reproducer is replayed by every build, sanitizer builds included.
 * A target reports a bug by crashing or abort(); this driver only fails on
 * an unreadable input or an empty corpus (a test that replays nothing proves
 * nothing).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, n;
	FILE *f = fopen(path, "rb");

	if (!f) {
		perror(path);
		return -1;
	}
	do {
		if (len == cap) {
			uint8_t *nb = realloc(buf, cap = cap ? 2 * cap : 4096);

			if (!nb) {
				free(buf);
				fclose(f);
				return -1;
			}
			buf = nb;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n);
	if (ferror(f)) {
		perror(path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	/* An exact-size copy, so that ASan sees any read past the input's end. */
	{
		uint8_t *exact = malloc(len ? len : 1);

		if (!exact) {
			free(buf);
			return -1;
		}
		memcpy(exact, buf, len);
		free(buf);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
	}
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every regular file of @dir; returns the count, or -1. */
static int run_dir(const char *dir)
{
	struct dirent *de;
	char **names = NULL, path[4096];
	size_t n = 0, cap = 0, i;
	int ret = 0;
	DIR *d = opendir(dir);

	if (!d) {
		perror(dir);
		return -1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (n == cap) {
			char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));

			if (!nn) {
				ret = -1;
				break;
			}
			names = nn;
		}
		if (!(names[n] = strdup(de->d_name))) {
			ret = -1;
			break;
		}
		n++;
	}
	closedir(d);
	if (!ret)
		qsort(names, n, sizeof(*names), name_cmp);
	for (i = 0; i < n; i++) {
		if (!ret) {
			snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
			if (run_file(path))
				ret = -1;
		}
		free(names[i]);
	}
	free(names);
	return ret ? ret : (int)n;
}

int main(int argc, char **argv)
{
	int i, total = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (i = 1; i < argc; i++) {
		struct stat st;
		int n;

		if (stat(argv[i], &st)) {
			perror(argv[i]);
			return 1;
		}
		if (S_ISDIR(st.st_mode)) {
			n = run_dir(argv[i]);
		} else {
			n = run_file(argv[i]) ? -1 : 1;
		}
		if (n < 0)
			return 1;
		total += n;
	}
	printf("%s: replayed %d inputs\n", argv[0], total);
	if (!total) {
		fprintf(stderr, "%s: no inputs: an empty corpus tests nothing\n", argv[0]);
		return 1;
	}
	return 0;
}
