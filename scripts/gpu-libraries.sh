# gpu-libraries.sh - sourced by gpu-bundle.sh and gpu-check.sh: which shared libraries a
# bundled binary takes from the GPU machine rather than from the bundle's lib/.
#
# system_lib: glibc, the C++ runtime and the loader (ld.so resolves linux-vdso itself); the
# bundle carries them separately, in sysroot/, for a machine whose own are too old.
# cuda_lib: the driver and the CUDA libraries, always the machine's own.
system_lib='^(linux-vdso|ld-linux(-x86-64)?|libc|libm|libmvec|libdl|libpthread|librt|libutil|libresolv|libanl|libstdc\+\+|libgcc_s)\.so'
cuda_lib='^(libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
