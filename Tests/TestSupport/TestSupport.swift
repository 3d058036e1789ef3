import Foundation

// Helpers shared by the test targets (not shipped): running programs off the cooperative pool,
// and deterministic sample bytes.

/// Runs blocking `body` on a thread of its own and awaits its result: blocking syscalls on a FUSE
/// mount served by this process must never occupy a cooperative-pool thread.
public func offThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(with: Result { try body() })
        }
    }
}

/// Blocking work started on its own thread at once (a `Task` would wait for a free
/// cooperative thread, and the pool may be busy with other suites); await ``value`` later.
public final class Background<T: Sendable>: @unchecked Sendable {
    private let condition = NSCondition()
    private var result: Result<T, any Error>?

    public init(_ body: @escaping @Sendable () throws -> T) {
        Thread.detachNewThread { [self] in
            let outcome = Result { try body() }
            condition.lock()
            result = outcome
            condition.broadcast()
            condition.unlock()
        }
    }

    private func wait() throws -> T {
        condition.lock()
        defer { condition.unlock() }
        while result == nil { condition.wait() }
        return try result!.get()
    }

    public var value: T {
        get async throws { try await offThread { try self.wait() } }
    }

    /// Whether the body has returned or thrown.
    public var isFinished: Bool {
        condition.lock()
        defer { condition.unlock() }
        return result != nil
    }
}

/// How a program ended and what it printed.
public struct ProcessResult: Sendable {
    public var status: Int32
    public var output: String
    public var error: String
}

/// Runs a program to completion (call it off the cooperative pool, see ``offThread(_:)``).
public func run(_ executable: String, _ arguments: [String], directory: String? = nil) throws -> ProcessResult
{
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let output = out.fileHandleForReading.readDataToEndOfFile()
    let error = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return ProcessResult(
        status: process.terminationStatus, output: String(decoding: output, as: UTF8.self),
        error: String(decoding: error, as: UTF8.self))
}

/// Deterministic pseudo-random bytes (an "image"), the same for the same seed.
public func sampleBytes(_ count: Int, seed: UInt64) -> Data {
    var state = seed &+ 0x9E37_79B9_7F4A_7C15
    var data = Data(count: count)
    data.withUnsafeMutableBytes { (raw: UnsafeMutableRawBufferPointer) in
        for i in 0..<count {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            raw[i] = UInt8(truncatingIfNeeded: state >> 33)
        }
    }
    return data
}

/// A small seeded generator (splitmix64), so that a failing random case can be replayed.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// glibc's `makedev`: a device number from its major and minor parts (a macro Swift does not
/// import).
public func deviceNumber(_ major: UInt64, _ minor: UInt64) -> UInt64 {
    ((major & 0xFFFF_F000) << 32) | ((major & 0xFFF) << 8) | ((minor & 0xFFFF_FF00) << 12) | (minor & 0xFF)
}
