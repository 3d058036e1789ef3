import CFuse3

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

extension MountOptions {
    /// Whether libfuse accepts `option` among ``options``, decided by libfuse itself: a session
    /// is created with that option alone (which parses mount options too) and destroyed
    /// without mounting. Checking first lets a caller name a refused option in its own words,
    /// so libfuse's explanation on standard error is silenced meanwhile, for the whole process.
    public static func libfuseAccepts(option: String) -> Bool {
        let arguments = ["docfs-fuse", "-o", option]
        var cArguments: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in cArguments { free(pointer) } }
        var operations = fuse_lowlevel_ops()
        let savedError = dup(STDERR_FILENO)
        let null = open("/dev/null", O_WRONLY | O_CLOEXEC)
        if savedError >= 0, null >= 0 { dup2(null, STDERR_FILENO) }
        defer {
            if savedError >= 0 {
                dup2(savedError, STDERR_FILENO)
                close(savedError)
            }
            if null >= 0 { close(null) }
        }
        let session = cArguments.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: Int32(arguments.count), argv: argv.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &operations, MemoryLayout<fuse_lowlevel_ops>.size, nil)
        }
        guard let session else { return false }
        fuse_session_destroy(session)
        return true
    }
}
