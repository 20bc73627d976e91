/* fake_pyxis: a no-op SPANK plugin that accepts pyxis' srun/sbatch options so that
 * launch scripts using --container-image etc. can run on a CI cluster without enroot.
 * Each option value is exported into the task environment as PYXIS_FAKE_<NAME>.
 * Vendored from ../shared/reference/slurm-ci/fake_pyxis.c; added here: an optional plugin argument
 * log=/path (plugstack.conf: "required fake_pyxis.so log=/path") to which each task appends the
 * options it received, so a test can prove the flags reached the remote tasks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <slurm/spank.h>

SPANK_PLUGIN(fake_pyxis, 1);

#define NOPT 6
static const char *names[NOPT] = {"container-image", "container-mounts", "container-workdir",
                                  "container-name", "no-container-mount-home", "container-env"};
static const char *envs[NOPT]  = {"PYXIS_FAKE_IMAGE", "PYXIS_FAKE_MOUNTS", "PYXIS_FAKE_WORKDIR",
                                  "PYXIS_FAKE_NAME", "PYXIS_FAKE_NO_MOUNT_HOME", "PYXIS_FAKE_ENV"};
static char *vals[NOPT];

static int cb(int val, const char *optarg, int remote) {
    if (val < 0 || val >= NOPT) return -1;
    free(vals[val]);
    vals[val] = strdup(optarg && *optarg ? optarg : "1");
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
    for (int i = 0; i < NOPT; i++) {
        struct spank_option o = { (char *)names[i], (i == 4) ? NULL : "ARG",
                                  "[fake pyxis] accepted and ignored", (i == 4) ? 0 : 1, i, cb };
        if (spank_option_register(sp, &o) != ESPANK_SUCCESS) return -1;
    }
    return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    const char *log = NULL;
    for (int i = 0; i < ac; i++)
        if (strncmp(av[i], "log=", 4) == 0) log = av[i] + 4;
    FILE *f = NULL;
    int any = 0;
    for (int i = 0; i < NOPT; i++) any |= vals[i] != NULL;
    if (log && any) f = fopen(log, "a");
    uint32_t job = 0, task = 0;
    spank_get_item(sp, S_JOB_ID, &job);
    spank_get_item(sp, S_TASK_GLOBAL_ID, &task);
    for (int i = 0; i < NOPT; i++) {
        if (!vals[i]) continue;
        spank_setenv(sp, envs[i], vals[i], 1);
        if (f) fprintf(f, "job=%u task=%u %s=%s\n", job, task, names[i], vals[i]);
    }
    if (f) fclose(f);
    return 0;
}
