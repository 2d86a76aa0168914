/* One line per probe: "<name> OK" or "<name> <ERRNO-NAME>". Built by tests/sandbox/test_seccomp.py
 * with gcc at test time and run inside a sandbox. Arguments are chosen so that WITHOUT a
 * filter the call succeeds or fails with a different errno than the filter's (EFAULT,
 * EINVAL, EBADF, ENOTTY, ENOSPC...): the same probe under `--seccomp off` proves each line
 * can tell the filter apart from the kernel's own refusal. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef __X32_SYSCALL_BIT
#define __X32_SYSCALL_BIT 0x40000000UL
#endif
#define UFFD_USER_MODE_ONLY 1
#define KEYCTL_GET_KEYRING_ID 0
#define KEY_SPEC_SESSION_KEYRING -3
#define NR_OPEN_TREE_ATTR 467
#define HIGH (1UL << 32)

static const char *name(int e) {
  switch (e) {
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EFAULT: return "EFAULT";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    case ENOTTY: return "ENOTTY";
    case ENOSPC: return "ENOSPC";
    case EACCES: return "EACCES";
    case ESRCH: return "ESRCH";
    case ENOENT: return "ENOENT";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    default: return "E?";
  }
}

static void report(const char *probe, long r) {
  if (r >= 0) printf("%s OK\n", probe);
  else printf("%s %s\n", probe, name(errno));
  fflush(stdout);
}

/* clone/unshare that might succeed: the child (or the new namespace) must end at once. */
static long clone_flags(unsigned long flags) {
  long r = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
  if (r == 0) _exit(0);
  if (r > 0) waitpid((pid_t)r, NULL, 0);
  return r;
}

static long unshare_in_child(unsigned long flags) {
  int pipefd[2];
  if (pipe(pipefd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    long r = syscall(SYS_unshare, flags);
    int e = r < 0 ? errno : 0;
    write(pipefd[1], &e, sizeof e);
    _exit(0);
  }
  int e = 0;
  read(pipefd[0], &e, sizeof e);
  waitpid(pid, NULL, 0);
  close(pipefd[0]);
  close(pipefd[1]);
  if (e) { errno = e; return -1; }
  return 0;
}

/* getpid through the i386 entry (int 0x80) of a 64-bit process: unfiltered, the pid (or
 * ENOSYS without IA32 emulation); the x86_64 filter sees a foreign arch. */
static long i386_getpid(void) {
#ifdef __x86_64__
  long r;
  __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory", "r8", "r9", "r10", "r11");
  if (r < 0 && r > -4096) { errno = (int)-r; return -1; }
  return r;
#else
  return 0;
#endif
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
#define PROBE(n, expr) do { if (!only || !strcmp(only, n)) { errno = 0; report(n, (expr)); } } while (0)

  /* A sibling to trace: a child that waits to be killed. */
  pid_t sib = fork();
  if (sib == 0) { pause(); _exit(0); }
  PROBE("ptrace", ptrace(PTRACE_ATTACH, sib, 0, 0));
  kill(sib, SIGKILL);
  waitpid(sib, NULL, 0);

  char buf[8] = {0}, src[8] = "abcdefg";
  struct iovec l = {buf, sizeof buf}, rm = {src, sizeof src};
  PROBE("process_vm_readv", syscall(SYS_process_vm_readv, getpid(), &l, 1, &rm, 1, 0));
  PROBE("process_vm_writev", syscall(SYS_process_vm_writev, getpid(), &l, 1, &rm, 1, 0));

  PROBE("keyctl", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
  PROBE("add_key", syscall(SYS_add_key, "user", "petri-probe", "x", 1, KEY_SPEC_SESSION_KEYRING));
  PROBE("request_key", syscall(SYS_request_key, "user", "petri-probe-none", NULL, 0));

  /* Unfiltered: EFAULT (the target path is not readable memory), before any privilege check. */
  PROBE("mount", syscall(SYS_mount, NULL, (char *)1, NULL, 0, NULL));
  /* Unfiltered: EINVAL (unknown flags are checked first). */
  PROBE("umount2", syscall(SYS_umount2, "/", 0xff00));
  PROBE("pivot_root", syscall(SYS_pivot_root, (char *)1, (char *)1));
  PROBE("chroot", syscall(SYS_chroot, (char *)1));
  /* Unfiltered: fsopen needs CAP_SYS_ADMIN (EPERM); open_tree of "/" without flags works. */
  PROBE("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
  PROBE("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/", 0));
  PROBE("open_tree_attr", syscall(NR_OPEN_TREE_ATTR, AT_FDCWD, "/", 0, NULL, 0));
  PROBE("move_mount", syscall(SYS_move_mount, -1, "", -1, "", 0));
  PROBE("mount_setattr", syscall(SYS_mount_setattr, -1, "", 0, NULL, 0));

  /* bwrap --disable-userns: without the filter a new user namespace gives ENOSPC. */
  PROBE("unshare_user", unshare_in_child(CLONE_NEWUSER));
  PROBE("unshare_files", unshare_in_child(CLONE_FILES));
  PROBE("clone_newuser", clone_flags(CLONE_NEWUSER));
  PROBE("clone_newuser_high_bits", clone_flags(HIGH | CLONE_NEWUSER));
  PROBE("clone_plain", clone_flags(0));
  PROBE("setns", syscall(SYS_setns, -1, 0));
  /* Unfiltered: EINVAL (a NULL, zero-sized clone_args). */
  PROBE("clone3", syscall(SYS_clone3, NULL, 0));

  PROBE("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
  PROBE("bpf", syscall(SYS_bpf, 9999, NULL, 0));                 /* unfiltered: EINVAL */
  PROBE("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0)); /* EFAULT */
  PROBE("userfaultfd", syscall(SYS_userfaultfd, UFFD_USER_MODE_ONLY | O_CLOEXEC));
  PROBE("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL)); /* unfiltered: EFAULT */
  PROBE("io_uring_enter", syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0));

  /* stdin is not a terminal in `petri run`: unfiltered, ENOTTY. */
  char c = 'x';
  PROBE("tiocsti", syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI, &c));
  PROBE("tiocsti_high_bits", syscall(SYS_ioctl, 0, HIGH | TIOCSTI, &c));
  PROBE("tioclinux", syscall(SYS_ioctl, 0, (unsigned long)TIOCLINUX, &c));
  PROBE("ioctl_fionread", ({ int n; ioctl(0, FIONREAD, &n); })); /* an allowed ioctl: not EPERM */

  /* x32 getpid (39 | __X32_SYSCALL_BIT): unfiltered, ENOSYS (no x32 ABI) or the pid. */
  PROBE("x32", syscall(__X32_SYSCALL_BIT | 39));
  PROBE("i386", i386_getpid());

  /* Setuid/setgid bits: unfiltered, the owner may set them (OK). The file is the probe's own. */
  int fd = open("suid-probe", O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
  PROBE("chmod_setuid", chmod("suid-probe", 04755));
  PROBE("chmod_setgid", chmod("suid-probe", 02755));
  PROBE("chmod_setuid_high_bits", syscall(SYS_chmod, "suid-probe", HIGH | 04755));
  PROBE("fchmodat_setuid", fchmodat(AT_FDCWD, "suid-probe", 04755, 0));
  PROBE("fchmod_setuid", ({ int f = open("suid-probe", O_RDONLY); long r = fchmod(f, 04755); close(f); r; }));
  PROBE("open_creat_setuid", ({ unlink("suid-new"); int f = syscall(SYS_openat, AT_FDCWD, "suid-new",
                                  O_CREAT | O_WRONLY, 04755); if (f >= 0) close(f); f; }));
  PROBE("chmod_plain", chmod("suid-probe", 0755));  /* allowed: not EPERM */
  /* mknod makes a regular file without CAP_MKNOD, with the mode's bits (only the umask applies). */
  PROBE("mknod_setuid", ({ unlink("suid-new"); syscall(SYS_mknod, "suid-new", S_IFREG | 04755, 0); }));
  PROBE("mknod_setgid", ({ unlink("suid-new"); syscall(SYS_mknod, "suid-new", S_IFREG | 02755, 0); }));
  PROBE("mknodat_setuid", ({ unlink("suid-new"); syscall(SYS_mknodat, AT_FDCWD, "suid-new", S_IFREG | 06755, 0); }));
  PROBE("mknodat_setuid_high_bits", ({ unlink("suid-new");
                                       syscall(SYS_mknodat, AT_FDCWD, "suid-new", HIGH | S_IFREG | 04755, 0); }));
  PROBE("mknod_plain", ({ unlink("suid-new"); syscall(SYS_mknodat, AT_FDCWD, "suid-new", S_IFREG | 0755, 0); }));
  PROBE("mknod_fifo", ({ unlink("suid-new"); syscall(SYS_mknod, "suid-new", S_IFIFO | 0644, 0); }));
  /* openat2 carries its mode in memory: the filter refuses the call (ENOSYS, callers fall back). */
  PROBE("openat2_setuid", ({ unlink("suid-new"); struct { unsigned long long flags, mode, resolve; } how =
                             {O_CREAT | O_WRONLY, 04755, 0};
                             long f = syscall(SYS_openat2, AT_FDCWD, "suid-new", &how, sizeof how);
                             if (f >= 0) close((int)f); f; }));
  unlink("suid-probe");
  unlink("suid-new");

  PROBE("socket_inet", ({ int s = socket(AF_INET, SOCK_STREAM, 0); if (s >= 0) close(s); s; }));
  PROBE("socket_unix", ({ int s = socket(AF_UNIX, SOCK_STREAM, 0); if (s >= 0) close(s); s; }));
  PROBE("socketpair_unix", ({ int sv[2]; int r = socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
                              if (r == 0) { close(sv[0]); close(sv[1]); } r; }));
  return 0;
}
