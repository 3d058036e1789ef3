import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Reads a file of the kernel's (`/proc/…`) whole. Foundation's `String(contentsOfFile:)` and
/// `Data(contentsOf:)` size their read by `stat`, which is 0 for these files, and return only
/// the first page: `/proc/self/mountinfo` past 4 KiB (a machine with a dozen mounts) came back
/// without the newest mounts.
public func readSystemFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            return nil
        }
        if n == 0 { break }
        bytes += buffer[0..<n]
    }
    return String(decoding: bytes, as: UTF8.self)
}
