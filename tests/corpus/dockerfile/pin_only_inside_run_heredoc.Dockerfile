# expect: line=5 value=inside the here-document opened on line 4
FROM python:3.12-slim
WORKDIR /app
RUN <<EOF
ENV HARBOR_COMMIT=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
EOF
RUN uv pip install --force-reinstall "harbor @ git+https://github.com/marin-community/harbor.git@${HARBOR_COMMIT}"
