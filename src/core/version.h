/* core/version.h: the commit a program was built from, "unknown" outside a git checkout and with
 * "-dirty" when tracked files differed from it. Defined in the build tree's git_stamp.c, which
 * cmake/git_stamp.cmake rewrites at every build when the commit changes; linked into the programs
 * (dspark, bench_spec), not the library. */
#ifndef DSP_CORE_VERSION_H
#define DSP_CORE_VERSION_H

extern const char dsp_git_commit[];

#endif
