/* Two failing sk_syscall() of libsimkern.so, then exec of another program that does the same: one thread
 * (exec keeps the pid) whose executable changes between its sessions (tests/native/test_native_sessions.py,
 * the exe name of each session).
 * argv[1]: libsimkern.so; argv[2], if given: the program to exec after a line on stdin and the calls. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	void *lib = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
	long (*sk_syscall)(int) = lib ? (long (*)(int))dlsym(lib, "sk_syscall") : NULL;
	char line[8];

	if (!sk_syscall)
		return 2;
	if (argc > 2 && !fgets(line, sizeof(line), stdin))	/* the tracer is attached */
		return 3;
	sk_syscall(0);
	sk_syscall(0);	/* a second session of the same executable */
	if (argc > 2) {
		execl(argv[2], argv[2], argv[1], (char *)NULL);
		return 4;
	}
	return 0;
}
