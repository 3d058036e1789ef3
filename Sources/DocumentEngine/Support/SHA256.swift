import CLibCrypto
import Foundation

/// SHA-256, computed by the system's libcrypto (OpenSSL), which uses the CPU's SHA extensions
/// where it has them.
package enum SHA256 {
    /// The 32-byte digest of `data`.
    package static func hash(_ data: Data) -> Data { data.withUnsafeBytes { hash($0) } }

    /// The 32-byte digest of `bytes`.
    package static func hash(_ bytes: UnsafeRawBufferPointer) -> Data {
        var digest = Data(count: Int(SHA256_DIGEST_LENGTH))
        digest.withUnsafeMutableBytes { out in
            _ = CLibCrypto.SHA256(
                bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count,
                out.baseAddress?.assumingMemoryBound(to: UInt8.self))
        }
        return digest
    }
}
