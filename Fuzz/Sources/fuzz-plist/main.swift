// Fuzzes the property-list codec behind `docfs mount -o archives=xml` and `docfs plist`: any bytes,
// as XML text or as a binary property list, must give a value or a thrown error, never a crash or a
// hang; a value must survive XML (but a NaN's payload) and binary unchanged; and text compiled as a keyed archive
// must pass the archive validator or be refused by it.
import DocumentEngine
import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let limits = PropertyList.Limits(maximumSize: 1 << 20, maximumDepth: 64, maximumObjectCount: 1 << 14)
    let decoders: [(Data) -> PropertyListValue?] = [
        { try? PropertyList.decodeXML($0, limits: limits) },
        { try? PropertyList.decodeBinary($0, limits: limits) },
    ]
    for decode in decoders {
        guard let value = decode(data) else { continue }
        let binary = PropertyList.encodeBinary(value)
        let text = PropertyList.encodeXML(value)
        // Through XML a value keeps everything but a NaN's payload, so the text is what must
        // come back; through binary, every bit.
        guard let again = try? PropertyList.decodeXML(text, limits: limits),
            PropertyList.encodeXML(again) == text,
            let back = try? PropertyList.decodeBinary(binary, limits: limits), back == value
        else { fatalError("a decoded value did not survive encoding") }
        _ = PropertyList.describe(value)
    }
    _ = try? PropertyListText.compile(data, as: .keyedArchive)
    return 0
}

// SwiftPM gives an executable its own entry point, so libFuzzer's main() is not used: this one
// hands the command line to libFuzzer's driver, which calls `fuzzOne` for every input.
typealias FuzzerDriver =
    @convention(c) (
        UnsafeMutablePointer<CInt>, UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt
guard let driver = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "LLVMFuzzerRunDriver") else {
    fatalError("not built with -sanitize=fuzzer (scripts/fuzz.sh builds it)")
}
var argc = CommandLine.argc
var argv = CommandLine.unsafeArgv
exit(unsafeBitCast(driver, to: FuzzerDriver.self)(&argc, &argv, { fuzzOne($0, $1) }))
