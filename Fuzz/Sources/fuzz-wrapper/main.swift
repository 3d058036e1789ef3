// Fuzzes the serialized-wrapper decoder: any bytes must give a wrapper or a thrown error, never a
// crash, a hang or unbounded memory. A decoded wrapper must serialize again.
import DocumentEngine
import Foundation

// Also under libFuzzer's name: its main() (in the same archive as the driver) is linked too.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    guard let wrapper = try? FileWrapper(validatingSerializedRepresentation: data) else { return 0 }
    // What decodes must encode, and decode to the same bytes again.
    guard let again = wrapper.serializedRepresentation else {
        fatalError("a decoded wrapper does not serialize")
    }
    guard let copy = try? FileWrapper(validatingSerializedRepresentation: again) else {
        fatalError("a re-serialized wrapper does not decode")
    }
    if copy.serializedRepresentation != again { fatalError("serialization is not stable") }
    return 0
}

// SwiftPM gives an executable its own entry point, so libFuzzer's main() is not used: this one
// hands the command line to libFuzzer's driver, which calls `fuzzOne` for every input.
typealias FuzzerDriver = @convention(c) (
    UnsafeMutablePointer<CInt>, UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt
guard let driver = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "LLVMFuzzerRunDriver") else {
    fatalError("not built with -sanitize=fuzzer (scripts/fuzz.sh builds it)")
}
var argc = CommandLine.argc
var argv = CommandLine.unsafeArgv
exit(unsafeBitCast(driver, to: FuzzerDriver.self)(&argc, &argv, { fuzzOne($0, $1) }))
