fn main() {
    let mut big = String::from("mov %r0, 0\nmov %r3, 0x12345\n");
    for k in 0..40 {
        big.push_str(&format!(
            "mov %r4, %r3\nlsh %r4, 13\nxor %r3, %r4\nmov %r4, %r3\nrsh %r4, 7\nxor %r3, %r4\n\
             mov %r4, %r3\nlsh %r4, 17\nxor %r3, %r4\njeq %r3, {k}, +1\nadd %r0, %r3\n"
        ));
    }
    big.push_str("exit");
    let code = packjit_testkit::asm::assemble(&big).unwrap();
    for _ in 0..2000 {
        let p = packjit_frontend::decode(&code, &[]).unwrap();
        std::hint::black_box(&p);
    }
}
