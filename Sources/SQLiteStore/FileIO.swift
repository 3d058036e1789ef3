#if canImport(Glibc)
    import Glibc
#endif

/// Positioned I/O on the store's own files (packs, intent logs), whole or not at all.
enum FileIO {
    /// `pwrite(2)` of all of `buffer` at `offset`, again after an interruption or a short write:
    /// 0, or the errno of the write that failed.
    static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        guard let base = buffer.baseAddress else { return 0 }
        var done = 0
        while done < buffer.count {
            let count = pwrite(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                return errno
            }
            done += count
        }
        return 0
    }

    /// `pread(2)` into all of `buffer` from `offset`, again after an interruption or a short
    /// read: the bytes read (fewer only at the end of the file), or the errno of the read that
    /// failed.
    static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Result<
        Int, Failure
    > {
        guard let base = buffer.baseAddress else { return .success(0) }
        var done = 0
        while done < buffer.count {
            let count = pread(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                return .failure(Failure(code: errno))
            }
            if count == 0 { break }
            done += count
        }
        return .success(done)
    }

    /// An errno, as an error.
    struct Failure: Error {
        var code: Int32
    }
}
